// Attention on the GPU (kernels/cuda/attention.cu): the op's two paths, selectable for tests and
// the benchmark (bench/cuda/attention_bench.cu). Plain C header (no CUDA includes), so tests can
// call it.
//
//   cuDNN    cuDNN's fused flash attention (SDPA forward and backward graphs through the backend
//            API, kernels/cuda/attention_cudnn.cu): bf16 activations, head_dim a multiple of 8.
//   fallback tiled flash-style kernels with fp32 accumulation and a deterministic backward
//            (kernels/cuda/attention_flash.cu): fp32 (parity mode), head_dim up to 256, and
//            bf16 when cuDNN is missing or rejects the shape.
// cuda_attention_fwd / cuda_attention_bwd (kernels/ops.h) take the cuDNN path when it can run
// and say once per shape which path runs.
#pragma once
#include <stdio.h>
#include "../ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CUDA_ATTN_AUTO = 0, CUDA_ATTN_CUDNN = 1, CUDA_ATTN_FALLBACK = 2 } CudaAttnPath;

// The ops of kernels/ops.h with the path chosen by the caller: CUDA_ATTN_CUDNN runs cuDNN when
// it supports the call and the fallback otherwise; returns the path that ran.
CudaAttnPath cuda_attention_fwd_path(Ctx *ctx, const Tensor *qkv, int heads, Tensor *out,
                                     Tensor *lse, CudaAttnPath want);
// *bitwise_deterministic (may be NULL) says whether the path that ran gives identical dqkv on
// every run: always for the fallback; for cuDNN when the engine it chose carries no
// non-determinism note (ctx->deterministic asks for such an engine).
CudaAttnPath cuda_attention_bwd_path(Ctx *ctx, const Tensor *dout, const Tensor *qkv,
                                     const Tensor *out, const Tensor *lse, int heads,
                                     Tensor *dqkv, CudaAttnPath want, int *bitwise_deterministic);

// 1 when this build links cuDNN (HAVE_CUDNN in build/config.mk), else 0.
int cuda_attention_built_with_cudnn(void);
// Frees the attention state (cuDNN handle, plans, workspace); registered with
// cuda_ctx_on_destroy when the state is created.
void cuda_attention_release(Ctx *ctx);
#ifdef __cplusplus
}
#endif
