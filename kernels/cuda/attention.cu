// Multi-head attention on the GPU (kernels/ops.h has the contract, kernels/cuda/attention.h the
// two paths): checks the tensors, picks cuDNN's fused flash attention where it can run (bf16,
// head_dim a multiple of 8) and the fallback kernels otherwise, and says once per shape which
// path runs and why.
//
// Backward accumulates into dqkv on both paths: the fallback adds in its kernels; cuDNN writes
// dq, dk, dv into scratch laid out like dqkv and one add kernel folds it in (a read of the
// scratch and a read and write of dqkv, the price of the += contract). ATTENTION_WRITE_DQKV is
// for a dqkv nothing has written yet (the tape knows): cuDNN writes into it directly; the
// fallback zeroes it first.
#include "attention.h"
#include "attention_internal.h"
#include "../ops.h"
#include "../attention_shape.h"
#include <stdint.h>
#include <stdlib.h>

namespace {

// The shape rules are kernels/attention_shape.h's (both backends); the device and dtype ones here.
AttnDims attn_dims(const char *op, const Tensor *qkv, int heads) {
    CG_CHECK(qkv != NULL, "", "op %s: qkv is NULL", op);
    CG_CHECK(qkv->device == DEVICE_CUDA && (qkv->dtype == DTYPE_F32 || qkv->dtype == DTYPE_BF16),
             "the CUDA backend takes fp32 or bf16 tensors on the GPU",
             "op %s: qkv is a %s tensor on the %s", op, dtype_name(qkv->dtype),
             qkv->device == DEVICE_CUDA ? "GPU" : "CPU");
    const AttnShape s = attention_shape(op, qkv, heads);
    AttnDims a;
    a.B = s.B;
    a.N = s.N;
    a.C = s.C;
    a.H = s.H;
    a.D = s.D;
    a.scale = s.scale;
    a.dtype = qkv->dtype;
    return a;
}

// t is on the GPU with dtype and numel as expected.
void check_tensor(const char *op, const char *name, const Tensor *t, DType dtype, size_t numel) {
    CG_CHECK(t != NULL, "", "op %s: %s is NULL", op, name);
    char buf[64];
    CG_CHECK(t->device == DEVICE_CUDA && t->dtype == dtype,
             "activations and their gradients share ctx->act_dtype; lse is fp32",
             "op %s: %s is a %s tensor on the %s, expected %s on the GPU", op, name,
             dtype_name(t->dtype), t->device == DEVICE_CUDA ? "GPU" : "CPU", dtype_name(dtype));
    CG_CHECK(t->numel == numel, "", "op %s: %s has shape %s (%zu elements), expected %zu", op,
             name, tensor_shape_str(t, buf, sizeof buf), t->numel, numel);
}

unsigned long long shape_hash(const AttnDims &a, int backward, CudaAttnPath path) {
    unsigned long long h = 1469598103934665603ull;   // FNV-1a over the fields
    long long fields[] = {a.B, a.N, a.H, a.D, a.dtype, backward, path};
    for (long long f : fields) h = (h ^ (unsigned long long)f) * 1099511628211ull;
    return h;
}

// One line per (shape, direction, path), the first time it runs in this context.
void announce(Ctx *ctx, const AttnDims &a, int backward, CudaAttnPath path, const char *detail) {
    CudaAttnState *s = attn_state(ctx);
    unsigned long long h = shape_hash(a, backward, path);
    for (int i = 0; i < s->n_announced; i++)
        if (s->announced[i] == h) return;
    if (s->n_announced < CudaAttnState::MAX_ANNOUNCED) s->announced[s->n_announced++] = h;
    printf("attention %s B=%d N=%d heads=%d head_dim=%d %s: %s\n",
           backward ? "backward" : "forward ", a.B, a.N, a.H, a.D, dtype_name(a.dtype), detail);
}

}   // namespace

CudaAttnState *attn_state(Ctx *ctx) {
    CudaCtx *c = cuda_ctx_of(ctx);
    if (!c->attn) {
        c->attn = cg_calloc(1, sizeof(CudaAttnState));
        cuda_ctx_on_destroy(ctx, cuda_attention_release);
    }
    return (CudaAttnState *)c->attn;
}

void *attn_workspace(Ctx *ctx, size_t bytes) {
    CudaAttnState *s = attn_state(ctx);
    if (bytes > s->workspace_bytes) {
        cuda_free(s->workspace);   // cudaFree waits for the work that used it
        cuda_ctx_of(ctx)->moves++;
        size_t grown = bytes + bytes / 4;   // headroom, so alternating shapes settle quickly
        s->workspace = cuda_malloc(grown);
        s->workspace_bytes = grown;
    }
    return s->workspace;
}

extern "C" void cuda_attention_release(Ctx *ctx) {
    CudaCtx *c = cuda_ctx_of(ctx);
    CudaAttnState *s = c ? (CudaAttnState *)c->attn : NULL;
    if (!s) return;
    if (s->cudnn) cudnn_attention_release(s->cudnn);
    cuda_free(s->workspace);
    free(s);
    c->attn = NULL;
}

extern "C" CudaAttnPath cuda_attention_fwd_path(Ctx *ctx, const Tensor *qkv, int heads,
                                                Tensor *out, Tensor *lse, CudaAttnPath want) {
    const char *op = "attention_fwd";
    AttnDims a = attn_dims(op, qkv, heads);
    check_tensor(op, "out", out, a.dtype, (size_t)a.B * a.N * a.C);
    check_tensor(op, "lse", lse, DTYPE_F32, (size_t)a.B * a.H * a.N);
    if (a.B == 0 || a.N == 0) return CUDA_ATTN_FALLBACK;
    char why[1200] = "the fallback was asked for";
    if (want != CUDA_ATTN_FALLBACK &&
        cudnn_attention_fwd(ctx, a, qkv->data, out->data, tensor_f32(lse), why, sizeof why)) {
        announce(ctx, a, 0, CUDA_ATTN_CUDNN, why);
        return CUDA_ATTN_CUDNN;
    }
    char line[1300];
    snprintf(line, sizeof line, "fallback flash kernel (%s)", why);
    announce(ctx, a, 0, CUDA_ATTN_FALLBACK, line);
    flash_attention_fwd(cuda_stream_of(ctx), a, qkv->data, out->data, tensor_f32(lse));
    return CUDA_ATTN_FALLBACK;
}

// The backward on the chosen path; write: dqkv = gradient instead of +=.
static CudaAttnPath attention_bwd_run(Ctx *ctx, const Tensor *dout, const Tensor *qkv,
                                      const Tensor *out, const Tensor *lse, int heads,
                                      Tensor *dqkv, CudaAttnPath want,
                                      int *bitwise_deterministic, bool write) {
    const char *op = "attention_bwd";
    if (bitwise_deterministic) *bitwise_deterministic = 1;
    if (!dqkv) return CUDA_ATTN_FALLBACK;
    AttnDims a = attn_dims(op, qkv, heads);
    size_t tokens = (size_t)a.B * a.N;
    check_tensor(op, "out", out, a.dtype, tokens * a.C);
    check_tensor(op, "dout", dout, a.dtype, tokens * a.C);
    check_tensor(op, "lse", lse, DTYPE_F32, (size_t)a.B * a.H * a.N);
    check_tensor(op, "dqkv", dqkv, a.dtype, tokens * 3 * a.C);
    if (a.B == 0 || a.N == 0) return CUDA_ATTN_FALLBACK;
    char why[1200] = "the fallback was asked for";
    int det = 1;
    if (want != CUDA_ATTN_FALLBACK &&
        cudnn_attention_bwd(ctx, a, dout->data, qkv->data, out->data, tensor_f32(lse),
                            dqkv->data, write, why, sizeof why, &det)) {
        announce(ctx, a, 1, CUDA_ATTN_CUDNN, why);
        if (bitwise_deterministic) *bitwise_deterministic = det;
        return CUDA_ATTN_CUDNN;
    }
    char line[1300];
    snprintf(line, sizeof line, "fallback flash kernels (%s)", why);
    announce(ctx, a, 1, CUDA_ATTN_FALLBACK, line);
    float *di = (float *)attn_workspace(ctx, sizeof(float) * (size_t)a.B * a.H * a.N);
    if (write)   // the fallback kernels add: from zero
        CUDA_CHECK(cudaMemsetAsync(dqkv->data, 0, tensor_bytes(dqkv), cuda_stream_of(ctx)));
    flash_attention_bwd(cuda_stream_of(ctx), a, dout->data, qkv->data, out->data,
                        tensor_f32(lse), dqkv->data, di);
    return CUDA_ATTN_FALLBACK;
}

extern "C" CudaAttnPath cuda_attention_bwd_path(Ctx *ctx, const Tensor *dout, const Tensor *qkv,
                                                const Tensor *out, const Tensor *lse, int heads,
                                                Tensor *dqkv, CudaAttnPath want,
                                                int *bitwise_deterministic) {
    return attention_bwd_run(ctx, dout, qkv, out, lse, heads, dqkv, want, bitwise_deterministic,
                             false);
}

// The FLOPs of attention over qkv (B,N,3C) or (B,H,W,3C) for the per-op profile (kernels/ctx.h):
// the forward's two products, Q K^T and P V, are 4 B N^2 C; the backward's five, 10 B N^2 C.
static void report_attention_flops(Ctx *ctx, const Tensor *qkv, double products) {
    if (qkv->ndim < 2 || qkv->numel == 0) return;
    const double B = qkv->shape[0], C3 = qkv->shape[qkv->ndim - 1], N = (double)qkv->numel / (B * C3);
    ctx_profile_flops(ctx, 2.0 * products * B * N * N * (C3 / 3));
}

extern "C" void cuda_attention_fwd(Ctx *ctx, const Tensor *qkv, int heads, Tensor *out,
                                   Tensor *lse) {
    report_attention_flops(ctx, qkv, 2);
    cuda_attention_fwd_path(ctx, qkv, heads, out, lse, CUDA_ATTN_AUTO);
}

// ATTENTION_WRITE_DQKV: cuDNN writes dq, dk, dv straight into dqkv (no scratch, no add pass).
extern "C" void cuda_attention_bwd(Ctx *ctx, const Tensor *dout, const Tensor *qkv,
                                   const Tensor *out, const Tensor *lse, int heads, int flags,
                                   Tensor *dqkv) {
    report_attention_flops(ctx, qkv, 5);
    if (flags & ATTENTION_WRITE_DQKV)
        attention_bwd_run(ctx, dout, qkv, out, lse, heads, dqkv, CUDA_ATTN_AUTO, NULL, true);
    else
        cuda_attention_bwd_path(ctx, dout, qkv, out, lse, heads, dqkv, CUDA_ATTN_AUTO, NULL);
}
