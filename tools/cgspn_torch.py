"""libcgspn.so (kernels/cgspn.h) in PyTorch, via ctypes: the C-GSPN scan and GSPN-1's gate
recurrence as torch.autograd.Functions.

The C-GSPN scan:

    import sys; sys.path.insert(0, "tools")
    from cgspn_torch import GspnScan
    yc = GspnScan.apply(xc, gates, merge, shared_w)

    xc     (B, H, W, Cc)  channels-last latent input
    gates  (B, H, W, G)   per direction TB, BT, LR, RL: lam | u | wt_{-1} | wt_0 | wt_{+1};
                          G = 20*Cc (shared_w = 0) or 4*(2*Cc+3) (shared_w = 1); see cgspn.h
    merge  (4,)           m_d
    yc     (B, H, W, Cc)  sum_d m_d u_d h_d

dtypes: float64 (CPU only; for gradcheck), float32, bfloat16 (merge is used in fp32 then, and
its gradient comes back in merge's own dtype). Tensors on the CPU or on a CUDA GPU; CUDA calls run
on torch's current stream of the tensors' device. The forward saves the scans' hidden state
(4*B*H*W*Cc values in fp32, fp64 for fp64) when a gradient is needed, so backward does not
recompute them.

GSPN-1's gate recurrence (NVlabs/GSPN's GateRecurrent2dnoind, a drop-in for its module):

    from cgspn_torch import GateRecurrent2dnoind      # instead of GSPN's ops.gaterecurrent
    scan = GateRecurrent2dnoind(items_each_chunk)
    out = scan(X, B, G1, G2, G3)                      # or GateRecurrent2dnoindFunction.apply(
                                                      #     X, B, G1, G2, G3, items_each_chunk)

    X, B, G1, G2, G3, out   (N, C, H, W); along W in runs of items_each_chunk columns:
    out[h][w] = B X + G1 out[h-1][w-1] + G2 out[h][w-1] + G3 out[h+1][w-1]   (see cgspn.h)

dtypes: float64 (CPU only), float32, bfloat16 (computed in fp32, rounded once on output), float16
(converted to fp32 and back); all five of one dtype, or promoted to a common one. CPU or CUDA
(planes of at most 2048 rows there); CUDA calls run on torch's current stream of the tensors'
device. The forward saves out for the backward (no recomputation).

The library is found at $CGSPN_LIB, else at libcgspn.so in the repository root (`make lib`).
"""
import ctypes
import functools
import os

import torch
import torch.nn as nn
from torch.autograd.function import once_differentiable

ABI_VERSION = 2  # CGSPN_ABI_VERSION this wrapper was written against

DEVICE_CPU, DEVICE_CUDA = 0, 1
GRAD_OVERWRITE, GRAD_ACCUMULATE = 0, 1
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float64: 2}

_lib = None


def library_path():
    env = os.environ.get("CGSPN_LIB")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "libcgspn.so")


def library():
    """The loaded libcgspn.so with its prototypes declared (loaded once)."""
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    if not os.path.exists(path):
        raise OSError(f"cgspn: {path} not found; run `make lib` in the repository root "
                      "or set CGSPN_LIB")
    lib = ctypes.CDLL(path)
    c_int, c_ptr = ctypes.c_int, ctypes.c_void_p
    lib.cgspn_abi_version.argtypes = []
    lib.cgspn_abi_version.restype = c_int
    lib.cgspn_status_string.argtypes = [c_int]
    lib.cgspn_status_string.restype = ctypes.c_char_p
    lib.cgspn_last_error.argtypes = []
    lib.cgspn_last_error.restype = ctypes.c_char_p
    lib.cgspn_cuda_available.argtypes = []
    lib.cgspn_cuda_available.restype = c_int
    lib.cgspn_gspn_scan_fwd.argtypes = [c_int, c_ptr, c_int] + [c_int] * 5 + [c_ptr] * 5
    lib.cgspn_gspn_scan_fwd.restype = c_int
    lib.cgspn_gspn_scan_bwd.argtypes = ([c_int, c_ptr, c_int] + [c_int] * 5 + [c_ptr] * 5 +
                                        [c_int] + [c_ptr] * 3)
    lib.cgspn_gspn_scan_bwd.restype = c_int
    version = lib.cgspn_abi_version()
    if version < ABI_VERSION:
        raise OSError(f"cgspn: {path} implements ABI version {version}; this wrapper needs "
                      f"{ABI_VERSION} or later (rebuild with `make lib`)")
    # ABI 2: device, stream, dtype, N, C, H, W, items_each_chunk, then the buffers
    lib.cgspn_gate_recurrent_fwd.argtypes = [c_int, c_ptr, c_int] + [c_int] * 5 + [c_ptr] * 6
    lib.cgspn_gate_recurrent_fwd.restype = c_int
    lib.cgspn_gate_recurrent_bwd.argtypes = ([c_int, c_ptr, c_int] + [c_int] * 5 + [c_ptr] * 7 +
                                             [c_int] + [c_ptr] * 5)
    lib.cgspn_gate_recurrent_bwd.restype = c_int
    _lib = lib
    return lib


def cuda_available():
    """True when the library can run the scan on a GPU (built with the CUDA kernel, GPU seen)."""
    return bool(library().cgspn_cuda_available())


def gate_width(Cc, shared_w):
    return 4 * (2 * Cc + 3) if shared_w else 20 * Cc


def _check(status, what):
    if status != 0:
        lib = library()
        detail = lib.cgspn_last_error().decode(errors="replace")
        reason = lib.cgspn_status_string(status).decode(errors="replace")
        raise RuntimeError(f"cgspn: {what} failed ({status}: {reason}): {detail}")


def _ptr(t):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _device_and_stream(t):
    if t.device.type == "cpu":
        return DEVICE_CPU, None
    if t.device.type == "cuda":
        return DEVICE_CUDA, ctypes.c_void_p(torch.cuda.current_stream(t.device).cuda_stream)
    raise ValueError(f"cgspn: tensors on {t.device} are not supported (cpu or cuda)")


def _check_inputs(xc, gates, merge, shared_w):
    if xc.dim() != 4:
        raise ValueError(f"cgspn: xc must be (B, H, W, Cc), got shape {tuple(xc.shape)}")
    B, H, W, Cc = xc.shape
    G = gate_width(Cc, shared_w)
    if tuple(gates.shape) != (B, H, W, G):
        raise ValueError(f"cgspn: gates must be {(B, H, W, G)} for xc {tuple(xc.shape)} and "
                         f"shared_w={shared_w}, got {tuple(gates.shape)}")
    if merge.numel() != 4:
        raise ValueError(f"cgspn: merge must have 4 elements, got {merge.numel()}")
    if xc.dtype not in _DTYPES:
        raise TypeError(f"cgspn: dtype {xc.dtype} is not supported (float32, bfloat16, float64)")
    if gates.dtype != xc.dtype:
        raise TypeError(f"cgspn: gates are {gates.dtype} but xc is {xc.dtype}")
    if gates.device != xc.device:
        raise ValueError(f"cgspn: gates are on {gates.device} but xc is on {xc.device}")


def _acc_dtype(dtype):
    """dtype of merge, dmerge and hidden in the ABI for activations of dtype."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class GspnScan(torch.autograd.Function):
    """yc = GspnScan.apply(xc, gates, merge, shared_w); differentiable in xc, gates and merge."""

    @staticmethod
    def forward(ctx, xc, gates, merge, shared_w):
        shared_w = 1 if shared_w else 0
        _check_inputs(xc, gates, merge, shared_w)
        xc = xc.contiguous()
        gates = gates.contiguous()
        m = merge.detach().reshape(4).to(device=xc.device, dtype=_acc_dtype(xc.dtype)).contiguous()
        B, H, W, Cc = xc.shape
        yc = torch.empty((B, H, W, Cc), dtype=xc.dtype, device=xc.device)
        hidden = None
        if any(ctx.needs_input_grad[:3]):
            hidden = torch.empty((4, B, H, W, Cc), dtype=m.dtype, device=xc.device)
        if xc.numel() == 0:
            yc.zero_()
        else:
            device, stream = _device_and_stream(xc)
            status = library().cgspn_gspn_scan_fwd(
                device, stream, _DTYPES[xc.dtype], B, H, W, Cc, shared_w,
                _ptr(xc), _ptr(gates), _ptr(m), _ptr(yc), _ptr(hidden))
            _check(status, "cgspn_gspn_scan_fwd")
        ctx.save_for_backward(xc, gates, m)
        ctx.hidden = hidden
        ctx.shared_w = shared_w
        ctx.merge_meta = (merge.shape, merge.dtype, merge.device)
        return yc

    @staticmethod
    @once_differentiable
    def backward(ctx, dyc):
        xc, gates, m = ctx.saved_tensors
        need_xc, need_gates, need_merge = ctx.needs_input_grad[:3]
        dxc = torch.empty_like(xc) if need_xc else None
        dgates = torch.empty_like(gates) if need_gates else None
        dmerge = torch.empty(4, dtype=m.dtype, device=m.device) if need_merge else None
        if dxc is None and dgates is None and dmerge is None:
            return None, None, None, None
        B, H, W, Cc = xc.shape
        if xc.numel() == 0:
            for g in (dxc, dgates, dmerge):
                if g is not None:
                    g.zero_()
        else:
            dyc = dyc.to(dtype=xc.dtype).contiguous()
            hidden = ctx.hidden
            device, stream = _device_and_stream(xc)
            status = library().cgspn_gspn_scan_bwd(
                device, stream, _DTYPES[xc.dtype], B, H, W, Cc, ctx.shared_w,
                _ptr(dyc), _ptr(xc), _ptr(gates), _ptr(m), _ptr(hidden), GRAD_OVERWRITE,
                _ptr(dxc), _ptr(dgates), _ptr(dmerge))
            _check(status, "cgspn_gspn_scan_bwd")
        if dmerge is not None:
            shape, dtype, device = ctx.merge_meta
            dmerge = dmerge.to(dtype=dtype, device=device).reshape(shape)
        return dxc, dgates, dmerge, None


def gspn_scan(xc, gates, merge, shared_w=False):
    """Functional form of GspnScan.apply."""
    return GspnScan.apply(xc, gates, merge, shared_w)


# ---- GSPN-1's gate recurrence ----------------------------------------------------------------

_GR_NAMES = ("X", "B", "G1", "G2", "G3")
_GR_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def _gr_inputs(tensors):
    """The five inputs contiguous, and the dtype they are promoted to (the output's)."""
    X = tensors[0]
    if X.dim() != 4:
        raise ValueError(f"cgspn: X must be (N, C, H, W), got shape {tuple(X.shape)}")
    for name, t in zip(_GR_NAMES, tensors):
        if tuple(t.shape) != tuple(X.shape):
            raise ValueError(f"cgspn: {name} must have X's shape {tuple(X.shape)}, got "
                             f"{tuple(t.shape)}")
        if t.device != X.device:
            raise ValueError(f"cgspn: {name} is on {t.device} but X is on {X.device}")
        if t.dtype not in _GR_DTYPES:
            raise TypeError(f"cgspn: {name} is {t.dtype}; the gate recurrence takes float64, "
                            "float32, bfloat16 or float16")
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    return [t.contiguous() for t in tensors], dtype


def _gr_run_dtype(dtype):
    """The dtype the library computes a dtype in: float16 goes through float32."""
    return torch.float32 if dtype == torch.float16 else dtype


class GateRecurrent2dnoindFunction(torch.autograd.Function):
    """out = GateRecurrent2dnoindFunction.apply(X, B, G1, G2, G3, items_each_chunk): NVlabs/GSPN's
    GateRecurrent2dnoindFunction on libcgspn; differentiable in X, B, G1, G2 and G3."""

    @staticmethod
    def forward(ctx, X, B, G1, G2, G3, items_each_chunk):
        chunk = int(items_each_chunk)
        if chunk < 1:
            raise ValueError(f"cgspn: items_each_chunk must be >= 1, got {items_each_chunk}")
        ins, dtype = _gr_inputs((X, B, G1, G2, G3))
        run = _gr_run_dtype(dtype)
        xs = [t.to(run) for t in ins]   # no copy where the dtype is already run's
        N, C, H, W = X.shape
        out = torch.empty((N, C, H, W), dtype=run, device=X.device)
        if out.numel() > 0:
            device, stream = _device_and_stream(out)
            status = library().cgspn_gate_recurrent_fwd(
                device, stream, _DTYPES[run], N, C, H, W, chunk, *[_ptr(t) for t in xs], _ptr(out))
            _check(status, "cgspn_gate_recurrent_fwd")
        # the inputs as given (converted again by the backward) and out as computed
        ctx.save_for_backward(*ins, out)
        ctx.chunk = chunk
        return out.to(dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        *ins, out = ctx.saved_tensors
        need = ctx.needs_input_grad[:5]
        if not any(need):
            return (None,) * 6
        run = out.dtype
        xs = [t.to(run) for t in ins]
        grads = [torch.empty_like(out) if n else None for n in need]
        N, C, H, W = out.shape
        if out.numel() > 0:
            dout = dout.to(run).contiguous()
            device, stream = _device_and_stream(out)
            status = library().cgspn_gate_recurrent_bwd(
                device, stream, _DTYPES[run], N, C, H, W, ctx.chunk, _ptr(dout),
                *[_ptr(t) for t in xs], _ptr(out), GRAD_OVERWRITE, *[_ptr(g) for g in grads])
            _check(status, "cgspn_gate_recurrent_bwd")
        else:
            grads = [None if g is None else g.zero_() for g in grads]
        return tuple(None if g is None else g.to(t.dtype) for g, t in zip(grads, ins)) + (None,)


gaterecurrent = GateRecurrent2dnoindFunction.apply   # NVlabs/GSPN's name for it


class GateRecurrent2dnoind(nn.Module):
    """NVlabs/GSPN's GateRecurrent2dnoind module on libcgspn, constructed and called as that one:
    GateRecurrent2dnoind(items_each_chunk)(X, B, G1, G2, G3). `backend` is accepted for GSPN's
    callers and has no effect: the library runs on the tensors' device (CPU or CUDA)."""

    def __init__(self, items_each_chunk, backend="cuda"):
        super().__init__()
        self.items_each_chunk = items_each_chunk
        self.backend = backend

    def forward(self, X, B, G1, G2, G3):
        return GateRecurrent2dnoindFunction.apply(X, B, G1, G2, G3, self.items_each_chunk)

    def extra_repr(self):
        return f"items_each_chunk={self.items_each_chunk}"
