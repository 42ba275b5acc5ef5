# GSPN-1's gate recurrence through tools/cgspn_torch.py (GateRecurrent2dnoindFunction and the
# GateRecurrent2dnoind module over libcgspn.so): torch.autograd.gradcheck in double on the CPU, a
# pure-PyTorch loop written here from the definition (kernels/cpu/gate_recurrent.h) and
# differentiated by autograd, the fp32, bf16 and fp16 CPU paths, and the CUDA kernel against the
# CPU (tall planes of two and four rows a thread, wide ones, unaligned views, the caller's stream).
#
# Run where torch is installed (the GPU machine), from the repository root:
#     make lib && python3 tests/gpu/test_gate_recurrent_torch.py -v
# (python3 -m pytest tests/gpu/test_gate_recurrent_torch.py works too). The CUDA cases skip
# without a GPU, or when libcgspn.so was built without CUDA (cgspn_cuda_available() == 0).
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from cgspn_torch import (GateRecurrent2dnoind, GateRecurrent2dnoindFunction,  # noqa: E402
                         cuda_available)

# Library (fp64) vs the loop (fp64): the same products and sums, possibly in another order.
REF_TOL = 1e-12
# fp32 vs fp64: a few roundings (~6e-8 each) per column, over at most a few dozen columns of
# gates whose magnitudes sum to at most 1 (errors do not grow along the scan).
F32_TOL = 1e-5
# bf16 output: fp32 results rounded once to 8 significant bits, <= 2^-9 relative each.
BF16_TOL = 4e-3
# bf16 gradients: their own rounding plus that of out, saved in bf16, a factor of dg1..dg3.
BF16_GRAD_TOL = 8e-3
# fp16 (computed in fp32): one rounding to 11 significant bits, <= 2^-12 relative, at the end.
F16_TOL = 1e-3
# CUDA fp32 vs CPU fp64: fused multiply-adds instead of separate roundings, over up to ~1000
# columns of stable gates; still far below a wrong neighbour or run boundary (order 1).
CUDA_F32_TOL = 1e-5

# (N, C, H, W, items_each_chunk): odd sizes; runs of 1, of 3 on 7 columns (a short last run), of
# 7 (W exactly), of 10 (one run, chunk > W); one row; one column.
SHAPES = [(2, 3, 5, 7, 1), (2, 3, 5, 7, 3), (2, 3, 5, 7, 7), (2, 3, 5, 7, 10),
          (2, 2, 1, 6, 4), (1, 2, 6, 1, 2), (1, 3, 4, 9, 2)]
GRADCHECK_SHAPES = [(1, 2, 3, 5, 2), (2, 1, 4, 4, 1), (1, 1, 1, 5, 3), (1, 2, 4, 1, 1),
                    (1, 1, 3, 6, 9)]


def make_inputs(shape, dtype=torch.float64, seed=0, device="cpu"):
    """X, B, G1, G2, G3, dout drawn in double on the CPU, then moved and cast. The gates are a
    random split of 1 with random signs (GSPN-1 normalizes its gates to sum to 1), so the scan
    stays bounded over any W."""
    g = torch.Generator().manual_seed(seed)
    N, C, H, W, _ = shape
    size = (N, C, H, W)
    X = torch.rand(size, generator=g, dtype=torch.float64) * 2 - 1
    B = torch.rand(size, generator=g, dtype=torch.float64) * 2 - 1
    a = torch.rand((3,) + size, generator=g, dtype=torch.float64) + 0.05
    sign = torch.where(torch.rand((3,) + size, generator=g, dtype=torch.float64) < 0.3, -1.0, 1.0)
    G = sign * a / a.sum(0, keepdim=True)
    dout = torch.rand(size, generator=g, dtype=torch.float64) * 2 - 1
    return [t.to(device=device, dtype=dtype) for t in (X, B, G[0], G[1], G[2], dout)]


def run(inputs, chunk):
    """out and (dX, dB, dG1, dG2, dG3) of sum(dout * out) through the wrapper."""
    *ins, dout = inputs
    leaves = [t.detach().clone().requires_grad_(True) for t in ins]
    out = GateRecurrent2dnoindFunction.apply(*leaves, chunk)
    grads = torch.autograd.grad(out, leaves, grad_outputs=dout)
    return out.detach(), grads


def rel_err(got, want):
    got, want = got.double().cpu(), want.double().cpu()
    return ((got - want).norm() / want.norm().clamp_min(1e-300)).item()


# ---- an independent reference: the definition, a column at a time --------------------------

def reference(X, B, G1, G2, G3, chunk):
    """out[h][w] = B X + G1 out[h-1][w-1] + G2 out[h][w-1] + G3 out[h+1][w-1] along W in runs of
    chunk columns (the state restarting at each run's first column), out outside the plane 0;
    vectorised over N, C, H."""
    W = X.shape[3]
    cols, prev = [], None
    for w in range(W):
        v = B[..., w] * X[..., w]
        if w % chunk != 0:
            up = F.pad(prev[..., :-1], (1, 0))   # out[h-1][w-1], 0 at h = 0
            dn = F.pad(prev[..., 1:], (0, 1))    # out[h+1][w-1], 0 at h = H-1
            v = v + G1[..., w] * up + G2[..., w] * prev + G3[..., w] * dn
        cols.append(v)
        prev = v
    return torch.stack(cols, dim=-1)


def run_reference(inputs, chunk):
    *ins, dout = inputs
    leaves = [t.detach().clone().requires_grad_(True) for t in ins]
    out = reference(*leaves, chunk)
    # with runs of one column (or W = 1) the gates are never read: their gradient is 0
    grads = torch.autograd.grad(out, leaves, grad_outputs=dout, allow_unused=True)
    return out.detach(), [torch.zeros_like(t) if g is None else g for g, t in zip(grads, leaves)]


def assert_close(test, got, want, tol, what=""):
    out, grads = got
    want_out, want_grads = want
    test.assertLess(rel_err(out, want_out), tol, f"out {what}")
    for name, g, w in zip(("dX", "dB", "dG1", "dG2", "dG3"), grads, want_grads):
        test.assertLess(rel_err(g, w), tol, f"{name} {what}")


# ---- tests ---------------------------------------------------------------------------------------

class CpuDouble(unittest.TestCase):
    def test_gradcheck(self):
        for i, shape in enumerate(GRADCHECK_SHAPES):
            with self.subTest(shape=shape):
                *ins, _ = make_inputs(shape, seed=10 + i)
                ins = tuple(t.requires_grad_(True) for t in ins)
                chunk = shape[4]
                self.assertTrue(torch.autograd.gradcheck(
                    lambda *t: GateRecurrent2dnoindFunction.apply(*t, chunk), ins,
                    eps=1e-6, atol=1e-7, rtol=1e-5))

    def test_matches_the_loop_and_its_autograd(self):
        for i, shape in enumerate(SHAPES):
            with self.subTest(shape=shape):
                inputs = make_inputs(shape, seed=20 + i)
                assert_close(self, run(inputs, shape[4]), run_reference(inputs, shape[4]),
                             REF_TOL, str(shape))

    def test_module_is_the_function(self):
        inputs = make_inputs((2, 3, 5, 7, 3), seed=30)
        module = GateRecurrent2dnoind(3)
        out = module(*inputs[:5])
        want, _ = run(inputs, 3)
        self.assertEqual(rel_err(out, want), 0.0)
        self.assertIn("items_each_chunk=3", repr(module))

    def test_backward_only_for_inputs_that_need_it(self):
        *ins, dout = make_inputs((2, 3, 4, 5, 2), seed=31)
        G2 = ins[3].clone().requires_grad_(True)
        out = GateRecurrent2dnoindFunction.apply(ins[0], ins[1], ins[2], G2, ins[4], 2)
        (dG2,) = torch.autograd.grad(out, [G2], grad_outputs=dout)
        _, want = run_reference(make_inputs((2, 3, 4, 5, 2), seed=31), 2)
        self.assertLess(rel_err(dG2, want[3]), REF_TOL)

    def test_non_contiguous_inputs_and_second_backward(self):
        inputs = make_inputs((2, 3, 4, 6, 4), seed=32)
        _, want = run_reference(inputs, 4)
        X = inputs[0].transpose(2, 3).contiguous().transpose(2, 3).requires_grad_(True)
        self.assertFalse(X.is_contiguous())
        out = GateRecurrent2dnoindFunction.apply(X, *inputs[1:5], 4)
        (d1,) = torch.autograd.grad(out, [X], grad_outputs=inputs[5], retain_graph=True)
        (d2,) = torch.autograd.grad(out, [X], grad_outputs=inputs[5])
        self.assertLess(rel_err(d1, want[0]), REF_TOL)
        self.assertEqual(rel_err(d2, d1), 0.0)

    def test_bad_arguments_raise(self):
        X, B, G1, G2, G3, _ = make_inputs((1, 2, 3, 4, 1))
        with self.assertRaises(ValueError):
            GateRecurrent2dnoindFunction.apply(X, B, G1[..., :3], G2, G3, 1)   # shapes differ
        with self.assertRaises(ValueError):
            GateRecurrent2dnoindFunction.apply(X[0], B[0], G1[0], G2[0], G3[0], 1)   # not 4-D
        with self.assertRaises(ValueError):
            GateRecurrent2dnoindFunction.apply(X, B, G1, G2, G3, 0)   # items_each_chunk < 1
        with self.assertRaises(TypeError):
            GateRecurrent2dnoindFunction.apply(X.int(), B, G1, G2, G3, 1)


class CpuLowPrecision(unittest.TestCase):
    def test_fp32_matches_fp64(self):
        for i, shape in enumerate(SHAPES):
            with self.subTest(shape=shape):
                x64 = make_inputs(shape, seed=40 + i)
                got = run([t.float() for t in x64], shape[4])
                self.assertEqual(got[0].dtype, torch.float32)
                assert_close(self, got, run(x64, shape[4]), F32_TOL, str(shape))

    def test_bf16_and_fp16_match_fp32_on_the_same_inputs(self):
        for dtype, tol, grad_tol in ((torch.bfloat16, BF16_TOL, BF16_GRAD_TOL),
                                     (torch.float16, F16_TOL, F16_TOL)):
            with self.subTest(dtype=dtype):
                low = make_inputs((2, 3, 6, 9, 4), dtype, seed=50)
                out, grads = run(low, 4)
                want_out, want_grads = run([t.float() for t in low], 4)
                self.assertEqual(out.dtype, dtype)
                self.assertLess(rel_err(out, want_out), tol)
                for g, w in zip(grads, want_grads):
                    self.assertEqual(g.dtype, dtype)
                    self.assertLess(rel_err(g, w), grad_tol)

    def test_mixed_dtypes_are_promoted(self):
        X, B, G1, G2, G3, dout = make_inputs((1, 2, 3, 5, 2), torch.float32, seed=51)
        out = GateRecurrent2dnoindFunction.apply(X, B.bfloat16(), G1, G2, G3, 2)
        self.assertEqual(out.dtype, torch.float32)
        want, _ = run([X, B.bfloat16().float(), G1, G2, G3, dout], 2)
        self.assertEqual(rel_err(out, want), 0.0)


def cuda_inputs(shape, dtype=torch.float32, seed=0):
    return make_inputs(shape, dtype, seed, device="cuda")


@unittest.skipUnless(torch.cuda.is_available() and cuda_available(),
                     "needs a GPU and libcgspn.so built with CUDA")
class Cuda(unittest.TestCase):
    # beyond SHAPES: GSPN-1's 56^2 stage (16-byte loads), W of 12 (8-byte bf16, 16-byte fp32 loads)
    # and 14 (4-byte), H past a warp, runs longer than W
    CUDA_SHAPES = SHAPES + [(2, 4, 56, 56, 56), (1, 3, 37, 12, 5), (2, 2, 33, 14, 14),
                            (1, 2, 70, 40, 100)]

    def test_fp32_matches_cpu_fp64(self):
        for i, shape in enumerate(self.CUDA_SHAPES):
            with self.subTest(shape=shape):
                x64 = make_inputs(shape, seed=60 + i)
                got = run([t.float().cuda() for t in x64], shape[4])
                self.assertTrue(got[0].is_cuda)
                assert_close(self, got, run(x64, shape[4]), CUDA_F32_TOL, str(shape))

    def test_tall_planes(self):
        # forward: 1100 rows, two a thread; backward: 600 rows two a thread, 1100 and 2048 four
        for i, shape in enumerate([(1, 2, 600, 9, 4), (1, 2, 1100, 9, 4), (1, 1, 2048, 6, 6),
                                   (1, 1, 1100, 16, 16)]):
            with self.subTest(shape=shape):
                x64 = make_inputs(shape, seed=70 + i)
                got = run([t.float().cuda() for t in x64], shape[4])
                assert_close(self, got, run(x64, shape[4]), CUDA_F32_TOL, str(shape))
                got16 = run([t.bfloat16().cuda() for t in x64], shape[4])
                want16 = run([t.bfloat16().float().cuda() for t in x64], shape[4])
                self.assertLess(rel_err(got16[0], want16[0]), BF16_TOL)
                for g, w in zip(got16[1], want16[1]):
                    self.assertLess(rel_err(g, w), BF16_GRAD_TOL)

    def test_wide_planes(self):
        for i, shape in enumerate([(1, 2, 7, 1000, 56), (2, 1, 5, 777, 1000), (1, 1, 3, 513, 1)]):
            with self.subTest(shape=shape):
                x64 = make_inputs(shape, seed=80 + i)
                got = run([t.float().cuda() for t in x64], shape[4])
                assert_close(self, got, run(x64, shape[4]), CUDA_F32_TOL, str(shape))

    def test_rows_of_32_byte_pieces(self):
        # W a multiple of 32 bytes from 256 columns on: each row's next 32 bytes of every input at
        # once (gr_fwd_runs_kernel); runs of 100 and 7 columns across its pieces, H past a warp and
        # at the 1024 rows of a block; bf16 (16 columns a piece) and fp32 (8)
        for i, shape in enumerate([(1, 2, 300, 256, 100), (2, 1, 33, 512, 512), (1, 1, 1024, 256, 7)]):
            with self.subTest(shape=shape):
                x64 = make_inputs(shape, seed=85 + i)
                got = run([t.float().cuda() for t in x64], shape[4])
                assert_close(self, got, run(x64, shape[4]), CUDA_F32_TOL, str(shape))
                got16 = run([t.bfloat16().cuda() for t in x64], shape[4])
                want16 = run([t.bfloat16().float().cpu().double() for t in x64], shape[4])
                self.assertLess(rel_err(got16[0], want16[0]), BF16_TOL)
                for g, w in zip(got16[1], want16[1]):
                    self.assertLess(rel_err(g, w), BF16_GRAD_TOL)

    def test_unaligned_views(self):
        # contiguous, but 4 bytes past a 16-byte boundary: the kernels take one column a load
        shape = (2, 3, 9, 16, 5)
        x64 = make_inputs(shape, seed=90)
        n = x64[0].numel()
        views = []
        for t in x64:
            flat = torch.empty(n + 1, dtype=torch.float32, device="cuda")
            flat[1:] = t.float().cuda().reshape(-1)
            views.append(flat[1:].view(t.shape))
        self.assertNotEqual(views[0].data_ptr() % 16, 0)
        assert_close(self, run(views, 5), run(x64, 5), CUDA_F32_TOL)

    def test_bf16_and_fp16_match_fp32(self):
        for dtype, tol, grad_tol in ((torch.bfloat16, BF16_TOL, BF16_GRAD_TOL),
                                     (torch.float16, F16_TOL, F16_TOL)):
            for i, shape in enumerate([(2, 3, 5, 7, 3), (2, 4, 56, 56, 56), (1, 3, 37, 12, 5),
                                       (2, 2, 33, 14, 14), (1, 2, 9, 31, 8)]):
                with self.subTest(dtype=dtype, shape=shape):
                    low = cuda_inputs(shape, dtype, seed=100 + i)
                    out, grads = run(low, shape[4])
                    want_out, want_grads = run([t.float() for t in low], shape[4])
                    self.assertEqual(out.dtype, dtype)
                    self.assertLess(rel_err(out, want_out), tol)
                    for g, w in zip(grads, want_grads):
                        self.assertEqual(g.dtype, dtype)
                        self.assertLess(rel_err(g, w), grad_tol)

    def test_deterministic(self):
        inputs = cuda_inputs((2, 3, 40, 24, 8), seed=110)
        a, b = run(inputs, 8), run(inputs, 8)
        self.assertTrue(torch.equal(a[0], b[0]))
        for x, y in zip(a[1], b[1]):
            self.assertTrue(torch.equal(x, y))

    def test_runs_on_the_current_stream(self):
        x64 = make_inputs((2, 3, 9, 11, 4), seed=120)
        want = run(x64, 4)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            got = run([t.float().cuda() for t in x64], 4)
        side.synchronize()
        assert_close(self, got, want, CUDA_F32_TOL)

    def test_fp64_and_too_tall_planes_are_refused(self):
        X, B, G1, G2, G3, _ = make_inputs((1, 2, 3, 4, 1), device="cuda")
        with self.assertRaises(RuntimeError):
            GateRecurrent2dnoindFunction.apply(X, B, G1, G2, G3, 1)
        X, B, G1, G2, G3, _ = cuda_inputs((1, 1, 2049, 2, 1))
        with self.assertRaisesRegex(RuntimeError, "2048"):
            GateRecurrent2dnoindFunction.apply(X, B, G1, G2, G3, 1)


if __name__ == "__main__":
    # The verdict is unittest's; the process then leaves without the interpreter's teardown, where
    # PyTorch's CUDA autograd worker threads can abort it after every test passed (as in
    # tests/gpu/test_torch_wrapper.py).
    result = unittest.main(exit=False).result
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if result.wasSuccessful() else 1)
