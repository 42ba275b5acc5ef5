// Shared by the attention files (C++ only): the problem's dimensions, the per-context state, and
// the two paths' entry points. kernels/cuda/attention.cu owns the state and picks the path.
#pragma once
#include "cuda_common.h"
#include <stddef.h>

// qkv (B,N,3C) with C = H*D; out (B,N,C); lse (B,H,N) fp32. Element (b,n,part,h,d) of qkv is at
// ((b*N + n)*3C + part*C + h*D + d): q, k, v of one head are strided (B,H,N,D) views of it.
struct AttnDims {
    int B, N, H, D, C;
    float scale;     // D^-0.5
    DType dtype;     // of qkv, out, dout, dqkv (lse is fp32)
};

struct CudnnAttnCache;   // kernels/cuda/attention_cudnn.cu

// One per CUDA context (CudaCtx.attn): a workspace that grows to the largest call, the cuDNN
// handle and plan cache, and the shapes whose path was already announced.
struct CudaAttnState {
    void *workspace;
    size_t workspace_bytes;
    CudnnAttnCache *cudnn;          // NULL until the first cuDNN call (or without cuDNN)
    enum { MAX_ANNOUNCED = 64 };
    unsigned long long announced[MAX_ANNOUNCED];   // hashes of (shape, dtype, direction, path)
    int n_announced;
};

CudaAttnState *attn_state(Ctx *ctx);
// Device memory of at least bytes (256-byte aligned), valid until the next call; grows by
// reallocation, so callers take it once per op.
void *attn_workspace(Ctx *ctx, size_t bytes);

// ---- fallback kernels (attention_flash.cu) ----------------------------------------------------
// Largest head_dim the fallback kernels handle.
constexpr int FLASH_MAX_HEAD_DIM = 256;
// out, lse from qkv.
void flash_attention_fwd(cudaStream_t stream, const AttnDims &a, const void *qkv, void *out,
                         float *lse);
// dqkv += gradient, from dout, qkv, out, lse; di is B*H*N floats of scratch.
void flash_attention_bwd(cudaStream_t stream, const AttnDims &a, const void *dout,
                         const void *qkv, const void *out, const float *lse, void *dqkv,
                         float *di);
// dst += src over n elements of dtype (each element by one thread: deterministic).
void attn_accumulate(cudaStream_t stream, DType dtype, const void *src, void *dst, size_t n);

// ---- cuDNN (attention_cudnn.cu) -----------------------------------------------------------
// Each returns true when cuDNN ran the call; false (with the reason in why) when this build has
// no cuDNN or cuDNN cannot run this shape, and the caller then runs the fallback. Graphs are built
// once per shape and cached, failures too.
bool cudnn_attention_fwd(Ctx *ctx, const AttnDims &a, const void *qkv, void *out, float *lse,
                         char *why, size_t why_len);
// dqkv += gradient (cuDNN writes dq, dk, dv into workspace scratch; an add folds it in), or
// with write, dqkv = gradient (cuDNN writes straight into dqkv).
// *deterministic says whether the chosen engine is free of non-determinism notes.
bool cudnn_attention_bwd(Ctx *ctx, const AttnDims &a, const void *dout, const void *qkv,
                         const void *out, const float *lse, void *dqkv, bool write, char *why,
                         size_t why_len, int *deterministic);
void cudnn_attention_release(CudnnAttnCache *cache);
// "cuDNN 9.19.0" or "no cuDNN in this build".
const char *cudnn_attention_version(char *buf, size_t len);
