# The ctypes wrapper tools/cgspn_torch.py (libcgspn.so as a torch.autograd.Function) against
# torch.autograd.gradcheck in double on the CPU, an independent pure-PyTorch implementation of
# docs/design.md#cgspn-layer (steps 3-5) differentiated by autograd, the fp32 and bf16 CPU paths against fp64, and
# CUDA against the CPU.
#
# Run where torch is installed (the GPU machine), from the repository root:
#     make lib && python3 tests/gpu/test_torch_wrapper.py -v
# (python3 -m pytest tests/gpu/test_torch_wrapper.py works too). The CUDA cases skip without a
# GPU, or when libcgspn.so was built without the CUDA scan kernel (cgspn_cuda_available() == 0).
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from cgspn_torch import GspnScan, cuda_available, gate_width  # noqa: E402

# fp32 vs fp64: a few dozen fp32 roundings (~6e-8 each) per value on scans of a few steps.
F32_TOL = 1e-5
# bf16 outputs are fp32 results rounded once to 8 significant bits: <= 2^-8 = 3.9e-3 relative.
BF16_TOL = 4e-3
# CUDA fp32 vs CPU fp64: another summation order and possibly fast exp/division on the GPU.
CUDA_F32_TOL = 1e-4
# CUDA bf16 vs CPU fp32 on the same bf16 inputs: bf16 output rounding plus the kernel's own
# internal roundings (it may keep bf16 intermediates).
CUDA_BF16_TOL = 2e-2
# Library (fp64) vs the pure-PyTorch reference (fp64): the same math in another order.
REF_TOL = 1e-10

# Small odd shapes (B, H, W, Cc), including single rows and columns where neighbours go missing.
GRADCHECK_SHAPES = [(1, 3, 5, 3), (2, 5, 3, 1), (1, 1, 5, 2), (1, 4, 1, 3)]
SHAPES = [(2, 3, 5, 3), (1, 7, 5, 2), (2, 1, 6, 3), (1, 5, 1, 1), (2, 9, 11, 5)]


def make_inputs(shape, shared_w, dtype=torch.float64, seed=0, device="cpu"):
    """xc, gates, merge, dyc drawn in double on the CPU, then moved and cast."""
    g = torch.Generator().manual_seed(seed)
    B, H, W, Cc = shape
    G = gate_width(Cc, shared_w)
    xc = torch.rand((B, H, W, Cc), generator=g, dtype=torch.float64) * 2 - 1
    gates = torch.rand((B, H, W, G), generator=g, dtype=torch.float64) * 4 - 2
    merge = torch.rand(4, generator=g, dtype=torch.float64) * 2 - 1
    dyc = torch.rand((B, H, W, Cc), generator=g, dtype=torch.float64) * 2 - 1
    out = [t.to(device=device, dtype=dtype) for t in (xc, gates, merge)]
    out[2] = out[2].to(torch.float64 if dtype == torch.float64 else torch.float32)
    return out + [dyc.to(device=device, dtype=dtype)]


def run(xc, gates, merge, dyc, shared_w):
    """yc and (dxc, dgates, dmerge) of sum(dyc * yc) through the wrapper."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (xc, gates, merge)]
    yc = GspnScan.apply(*leaves, shared_w)
    grads = torch.autograd.grad(yc, leaves, grad_outputs=dyc)
    return yc.detach(), grads


def rel_err(got, want):
    got, want = got.double().cpu(), want.double().cpu()
    return ((got - want).norm() / want.norm().clamp_min(1e-300)).item()


# ---- an independent reference: docs/design.md#cgspn-layer written with torch ops --------------------------------

def split_gates(gates, Cc, shared_w):
    """Per direction: lam, u (B,H,W,Cc) and wt (B,H,W,3,Cc or 1)."""
    B, H, W, _ = gates.shape
    out = []
    for d in range(4):
        if shared_w:
            blk = gates[..., d * (2 * Cc + 3):(d + 1) * (2 * Cc + 3)]
            wt = blk[..., 2 * Cc:].reshape(B, H, W, 3, 1)
        else:
            blk = gates[..., d * 5 * Cc:(d + 1) * 5 * Cc]
            wt = blk[..., 2 * Cc:].reshape(B, H, W, 3, Cc)
        out.append((blk[..., :Cc], blk[..., Cc:2 * Cc], wt))
    return out


def scan_rows(x, lam, wt):
    """TB scan over rows r of (B,R,Q,C); the neighbours k = -1, 0, +1 of (r, q) are (r-1, q+k)."""
    B, R, Q, C = x.shape
    exists = torch.ones(Q, 3, dtype=x.dtype, device=x.device)
    exists[0, 0] = 0       # q-1 missing at q = 0
    exists[Q - 1, 2] = 0   # q+1 missing at q = Q-1
    a = torch.sigmoid(wt) * exists[None, None, :, :, None]
    w = a / a.sum(3, keepdim=True).clamp_min(1e-7)
    rows, prev = [], None
    for r in range(R):
        h = lam[:, r] * x[:, r]
        if prev is not None:
            left = F.pad(prev[:, :-1], (0, 0, 1, 0))   # h[r-1, q-1]
            right = F.pad(prev[:, 1:], (0, 0, 0, 1))   # h[r-1, q+1]
            wr = w[:, r]
            h = h + wr[:, :, 0] * left + wr[:, :, 1] * prev + wr[:, :, 2] * right
        rows.append(h)
        prev = h
    return torch.stack(rows, 1)


def reference_scan(xc, gates, merge, shared_w):
    """yc = sum_d m_d u_d h_d, each direction run as a TB scan of a flipped/transposed grid."""
    Cc = xc.shape[3]
    to_frame = [lambda t: t,                              # TB
                lambda t: t.flip(1),                      # BT: rows bottom to top
                lambda t: t.transpose(1, 2),              # LR: columns left to right
                lambda t: t.transpose(1, 2).flip(1)]      # RL: columns right to left
    from_frame = [lambda t: t,
                  lambda t: t.flip(1),
                  lambda t: t.transpose(1, 2),
                  lambda t: t.flip(1).transpose(1, 2)]
    yc = torch.zeros_like(xc)
    for d, (lam, u, wt) in enumerate(split_gates(gates, Cc, shared_w)):
        h = scan_rows(to_frame[d](xc), to_frame[d](lam), to_frame[d](wt))
        yc = yc + merge[d] * u * from_frame[d](h)
    return yc


# ---- tests ---------------------------------------------------------------------------------------

class CpuDouble(unittest.TestCase):
    def test_gradcheck_per_channel_weights(self):
        self._gradcheck(shared_w=False)

    def test_gradcheck_shared_weights(self):
        self._gradcheck(shared_w=True)

    def _gradcheck(self, shared_w):
        for i, shape in enumerate(GRADCHECK_SHAPES):
            with self.subTest(shape=shape):
                xc, gates, merge, _ = make_inputs(shape, shared_w, seed=10 + i)
                inputs = tuple(t.requires_grad_(True) for t in (xc, gates, merge))
                self.assertTrue(torch.autograd.gradcheck(
                    lambda x, g, m: GspnScan.apply(x, g, m, shared_w), inputs,
                    eps=1e-6, atol=1e-7, rtol=1e-5))

    def test_matches_pure_pytorch_reference_and_its_autograd(self):
        for shared_w in (False, True):
            for i, shape in enumerate(SHAPES):
                with self.subTest(shape=shape, shared_w=shared_w):
                    xc, gates, merge, dyc = make_inputs(shape, shared_w, seed=20 + i)
                    yc, grads = run(xc, gates, merge, dyc, shared_w)
                    leaves = [t.clone().requires_grad_(True) for t in (xc, gates, merge)]
                    want = reference_scan(*leaves, shared_w)
                    want_grads = torch.autograd.grad(want, leaves, grad_outputs=dyc)
                    self.assertLess(rel_err(yc, want), REF_TOL)
                    for got, ref in zip(grads, want_grads):
                        self.assertLess(rel_err(got, ref), REF_TOL)

    def test_backward_only_for_inputs_that_need_it(self):
        xc, gates, merge, dyc = make_inputs((2, 3, 4, 2), True, seed=30)
        gates.requires_grad_(True)
        yc = GspnScan.apply(xc, gates, merge, True)
        (dgates,) = torch.autograd.grad(yc, [gates], grad_outputs=dyc)
        _, want = run(xc, gates.detach(), merge, dyc, True)
        self.assertLess(rel_err(dgates, want[1]), REF_TOL)

    def test_non_contiguous_inputs_and_second_backward(self):
        xc, gates, merge, dyc = make_inputs((2, 4, 3, 2), False, seed=31)
        _, want = run(xc, gates, merge, dyc, False)
        xt = xc.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_(True)
        self.assertFalse(xt.is_contiguous())
        yc = GspnScan.apply(xt, gates, merge, False)
        (dx1,) = torch.autograd.grad(yc, [xt], grad_outputs=dyc, retain_graph=True)
        (dx2,) = torch.autograd.grad(yc, [xt], grad_outputs=dyc)
        self.assertLess(rel_err(dx1, want[0]), REF_TOL)
        self.assertEqual(rel_err(dx2, dx1), 0.0)

    def test_bad_shapes_raise(self):
        xc, gates, merge, _ = make_inputs((1, 2, 3, 2), False)
        with self.assertRaises(ValueError):
            GspnScan.apply(xc, gates, merge, True)   # G is for per-channel weights
        with self.assertRaises(ValueError):
            GspnScan.apply(xc[0], gates, merge, False)


class CpuLowPrecision(unittest.TestCase):
    def test_fp32_path_matches_fp64(self):
        for shared_w in (False, True):
            for i, shape in enumerate(SHAPES):
                with self.subTest(shape=shape, shared_w=shared_w):
                    x64 = make_inputs(shape, shared_w, seed=40 + i)
                    x32 = [t.float() for t in x64]
                    y64, g64 = run(*x64, shared_w)
                    y32, g32 = run(*x32, shared_w)
                    self.assertEqual(y32.dtype, torch.float32)
                    self.assertLess(rel_err(y32, y64), F32_TOL)
                    for got, want in zip(g32, g64):
                        self.assertEqual(got.dtype, torch.float32)
                        self.assertLess(rel_err(got, want), F32_TOL)

    def test_bf16_path_matches_fp32_on_the_same_inputs(self):
        for shared_w in (False, True):
            xc, gates, merge, dyc = make_inputs((2, 6, 7, 4), shared_w, torch.bfloat16, seed=50)
            y16, g16 = run(xc, gates, merge, dyc, shared_w)
            y32, g32 = run(xc.float(), gates.float(), merge, dyc.float(), shared_w)
            self.assertEqual(y16.dtype, torch.bfloat16)
            self.assertLess(rel_err(y16, y32), BF16_TOL)
            for got, want in zip(g16, g32):
                self.assertLess(rel_err(got, want), BF16_TOL)


@unittest.skipUnless(torch.cuda.is_available() and cuda_available(),
                     "needs a GPU and libcgspn.so built with the CUDA scan kernel")
class Cuda(unittest.TestCase):
    def test_fp32_matches_cpu(self):
        for shared_w in (False, True):
            for i, shape in enumerate(SHAPES + [(2, 27, 27, 64)]):
                with self.subTest(shape=shape, shared_w=shared_w):
                    x64 = make_inputs(shape, shared_w, seed=60 + i)
                    xcu = [t.float().cuda() for t in x64]
                    y64, g64 = run(*x64, shared_w)
                    ycu, gcu = run(*xcu, shared_w)
                    self.assertTrue(ycu.is_cuda)
                    self.assertLess(rel_err(ycu, y64), CUDA_F32_TOL)
                    for got, want in zip(gcu, g64):
                        self.assertTrue(got.is_cuda)
                        self.assertLess(rel_err(got, want), CUDA_F32_TOL)

    def test_bf16_matches_cpu_fp32(self):
        for shared_w in (False, True):
            xc, gates, merge, dyc = make_inputs((2, 14, 14, 16), shared_w, torch.bfloat16,
                                                seed=70)
            ycu, gcu = run(xc.cuda(), gates.cuda(), merge.cuda(), dyc.cuda(), shared_w)
            y32, g32 = run(xc.float(), gates.float(), merge, dyc.float(), shared_w)
            self.assertEqual(ycu.dtype, torch.bfloat16)
            self.assertLess(rel_err(ycu, y32), CUDA_BF16_TOL)
            for got, want in zip(gcu, g32):
                self.assertLess(rel_err(got, want), CUDA_BF16_TOL)

    def test_runs_on_the_current_stream(self):
        x64 = make_inputs((2, 9, 11, 5), True, seed=80)
        y64, g64 = run(*x64, True)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            xcu = [t.float().cuda() for t in x64]
            ycu, gcu = run(*xcu, True)
        side.synchronize()
        self.assertLess(rel_err(ycu, y64), CUDA_F32_TOL)
        for got, want in zip(gcu, g64):
            self.assertLess(rel_err(got, want), CUDA_F32_TOL)

    def test_fp64_on_cuda_is_refused(self):
        xc, gates, merge, _ = make_inputs((1, 2, 3, 2), False, device="cuda")
        with self.assertRaises(RuntimeError):
            GspnScan.apply(xc, gates, merge, False)


if __name__ == "__main__":
    # The verdict is unittest's; the process then leaves without the interpreter's teardown, where
    # PyTorch's CUDA autograd worker threads can abort it after every test passed ("terminate
    # called without an active exception", seen once on an H200 with torch 2.11; the class of
    # pytorch/pytorch#38230).
    result = unittest.main(exit=False).result
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if result.wasSuccessful() else 1)
