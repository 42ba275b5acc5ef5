#!/usr/bin/env python3
"""GSPN-1's gate recurrence on the GPU: libcgspn's CUDA kernel (tools/cgspn_torch.py's
GateRecurrent2dnoindFunction) against the pure-PyTorch column loop, eager and torch.compile'd.

    make lib && python3 bench/bench_gate_recurrent.py            # every shape, bf16 and fp32
    python3 bench/bench_gate_recurrent.py --quick                # two shapes, bf16, fewer calls

Shapes (N, C, H, W, items_each_chunk): GSPN-1's stages at 224 px (56^2 .. 7^2, one run a row),
the paper's Fig. 3 (1024^2, batch 16, 8 channels) and Fig. S3 (1024^2, batch 256, 1 channel),
the last forward only. Each row: the forward alone (under no_grad) and forward + backward (the
five input gradients of sum(dout * out)), CUDA-event-timed, the median of --iters calls after
--warmup. The loop is the definition a column at a time, vectorised over N, C, H (as
tests/gpu/test_gate_recurrent_torch.py's reference); compiled with torch.compile (default mode),
where a compile that fails is reported and the row goes on; past --compile-max-w columns the
unrolled loop is not compiled (minutes of compile time). A shape whose buffers would not fit in
the GPU's free memory is skipped and said so. Columns: ms ours, ms loop eager, ms loop compiled,
speedup (the faster loop over ours), and our achieved GB/s, counting each input read once and each
output written once (forward: 5 in + out; forward + backward: that plus dout, the 5 inputs and
out read again and 5 gradients written).
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from cgspn_torch import GateRecurrent2dnoindFunction, cuda_available  # noqa: E402

# (N, C, H, W, items_each_chunk, forward only)
SHAPES = [
    (8, 96, 56, 56, 56, False),      # GSPN-1 stage 1 at 224 px
    (8, 192, 28, 28, 28, False),     # stage 2
    (8, 384, 14, 14, 14, False),     # stage 3
    (8, 768, 7, 7, 7, False),        # stage 4
    (64, 96, 56, 56, 56, False),     # stage 1, a training batch
    (16, 8, 1024, 1024, 1024, False),   # Fig. 3
    (256, 1, 1024, 1024, 1024, True),   # Fig. S3, forward only
]
QUICK_SHAPES = [(8, 96, 56, 56, 56, False), (16, 8, 1024, 1024, 1024, True)]


def loop(X, B, G1, G2, G3, chunk):
    """The definition (kernels/cpu/gate_recurrent.h) a column at a time."""
    cols, prev = [], None
    for w in range(X.shape[3]):
        v = B[..., w] * X[..., w]
        if w % chunk != 0:
            up = F.pad(prev[..., :-1], (1, 0))
            dn = F.pad(prev[..., 1:], (0, 1))
            v = v + G1[..., w] * up + G2[..., w] * prev + G3[..., w] * dn
        cols.append(v)
        prev = v
    return torch.stack(cols, dim=-1)


def ours(X, B, G1, G2, G3, chunk):
    return GateRecurrent2dnoindFunction.apply(X, B, G1, G2, G3, chunk)


def time_ms(fn, warmup, iters):
    """Median ms of fn() over iters CUDA-event-timed calls after warmup calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def make(shape, dtype, grad):
    N, C, H, W = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    X = torch.rand((N, C, H, W), device="cuda", dtype=dtype, generator=g) * 2 - 1
    B = torch.rand((N, C, H, W), device="cuda", dtype=dtype, generator=g)
    a = torch.rand((3, N, C, H, W), device="cuda", dtype=torch.float32, generator=g) + 0.05
    G = (a / a.sum(0, keepdim=True)).to(dtype)   # GSPN-1's gates sum to 1: bounded scans
    del a
    ins = [t.requires_grad_(grad) for t in (X, B, G[0].clone(), G[1].clone(), G[2].clone())]
    dout = torch.rand((N, C, H, W), device="cuda", dtype=dtype, generator=g) if grad else None
    return ins, dout


def step(fn, ins, dout, chunk):
    """fn's forward, or forward and backward when dout is given (returns nothing)."""
    if dout is None:
        with torch.no_grad():
            fn(*ins, chunk)
    else:
        out = fn(*ins, chunk)
        torch.autograd.grad(out, ins, grad_outputs=dout)


def bench_row(shape, dtype, backward, args, compiled_cache):
    N, C, H, W, chunk, _ = shape
    n = N * C * H * W
    esz = torch.tensor([], dtype=dtype).element_size()
    # buffers alive at once: 5 inputs + out (+ dout + 5 gradients), and the loop's own columns and
    # stacked copy (about 3 more of out), with backward its saved products (about 8)
    need = n * esz * ((12 if backward else 6) + (8 if backward else 3))
    free, _ = torch.cuda.mem_get_info()
    label = f"{N}x{C}x{H}x{W} c{chunk}"
    what = "fwd+bwd" if backward else "fwd"
    if need > 0.9 * free:
        print(f"{label:<26} {str(dtype)[6:]:<9} {what:<8} skipped: needs ~{need / 2**30:.1f} GiB, "
              f"{free / 2**30:.1f} GiB free", flush=True)
        return
    ins, dout = make((N, C, H, W), dtype, backward)
    iters = args.iters
    t_ours = time_ms(lambda: step(ours, ins, dout, chunk), args.warmup, iters)
    # the loop: fewer calls at large shapes (thousands of small kernels a call)
    loop_iters = max(1, iters // 5) if W > 128 else iters
    t_eager = time_ms(lambda: step(loop, ins, dout, chunk), 1, loop_iters)
    if args.no_compile:
        t_comp, comp_note = None, "off"
    elif W > args.compile_max_w:
        t_comp, comp_note = None, f"W>{args.compile_max_w}"
    else:
        key = (W, chunk, dtype, backward)
        try:
            if key not in compiled_cache:
                compiled_cache[key] = torch.compile(loop)
            t_comp = time_ms(lambda: step(compiled_cache[key], ins, dout, chunk), 2, loop_iters)
            comp_note = ""
        except Exception as e:   # noqa: BLE001 -- report any compile failure and go on
            t_comp, comp_note = None, "failed"
            print(f"  torch.compile failed on {label} {dtype}: {type(e).__name__}: "
                  f"{str(e).splitlines()[0][:200] if str(e) else ''}", file=sys.stderr, flush=True)
    best = min(t for t in (t_eager, t_comp) if t is not None)
    moved = n * esz * (6 + (12 if backward else 0))
    comp = f"{t_comp:10.3f}" if t_comp is not None else f"{comp_note:>10}"
    print(f"{label:<26} {str(dtype)[6:]:<9} {what:<8} {t_ours:9.3f} {t_eager:10.3f} {comp} "
          f"{best / t_ours:8.1f}x {moved / (t_ours * 1e-3) / 1e9:8.0f}", flush=True)
    del ins, dout
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="56^2 stage 1 and Fig. 3's forward, bf16 only, fewer calls")
    ap.add_argument("--dtypes", default="bf16,fp32", help="comma-separated: bf16, fp32")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    ap.add_argument("--compile-max-w", type=int, default=64,
                    help="compile the loop only up to this many columns (default 64)")
    args = ap.parse_args()
    if not torch.cuda.is_available() or not cuda_available():
        sys.exit("bench_gate_recurrent: needs a GPU and libcgspn.so built with CUDA (make lib)")
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    names = ["bf16"] if args.quick else args.dtypes.split(",")
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.quick:
        args.iters, args.warmup = min(args.iters, 5), min(args.warmup, 1)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; median of "
          f"{args.iters} calls (the loop: a fifth past W = 128); GB/s: ours")
    print(f"{'N x C x H x W, chunk':<26} {'dtype':<9} {'pass':<8} {'ms ours':>9} {'ms eager':>10} "
          f"{'ms compile':>10} {'speedup':>9} {'GB/s':>8}")
    # one compiled graph per shape, dtype and pass: past Dynamo's default limit of recompilations
    # of one function it would fall back to eager without saying so
    for limit in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 256)
    cache = {}
    for shape in shapes:
        for name in names:
            for backward in ((False,) if shape[5] else (False, True)):
                bench_row(shape, dtypes[name], backward, args, cache)


if __name__ == "__main__":
    main()
