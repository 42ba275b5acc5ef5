// cuBLASLt GEMMs for the CUDA ops (kernels/cuda/gemm.cu): one call description in cuBLASLt's
// column-major terms, a per-context cache of descriptors, layouts and heuristic algorithms keyed by
// (shape, leading dims, dtypes, epilogue, pointer alignment), and the checks the GEMM ops share.
//
// Row-major tensors are column-major transposes: a row-major (R, C) matrix with row stride ld is
// the column-major (C, R) matrix with the same ld. kernels/cuda/linear.cu spells out the mapping
// of each linear product onto this call.
#pragma once
#include <stdint.h>
#include "cuda_common.h"

// D (m, n) = op(A) op(B) + beta * C (C = D unless c is set), column-major, then the epilogue;
// compute and scale in fp32
// (CUBLAS_COMPUTE_32F: exact fp32 for fp32 inputs, no TF32; fp32 accumulation for bf16 inputs).
typedef struct CudaGemm {
    int trans_a, trans_b;           // op(A) = A^T when set (A stored (k, m)); likewise B (n, k)
    int m, n, k;
    const void *a;  int64_t lda;  cudaDataType_t a_type;
    const void *b;  int64_t ldb;  cudaDataType_t b_type;
    void *d;        int64_t ldd;  cudaDataType_t d_type;   // C = D (read when beta != 0) ...
    const void *c;  int64_t ldc;  // ... unless c is set: C (m, n), D's dtype, read when beta != 0
    float beta;                     // 0: overwrite D; 1: accumulate into D
    cublasLtEpilogue_t epilogue;    // 0 means CUBLASLT_EPILOGUE_DEFAULT
    // BIAS / GELU*_BIAS: bias (m) read. BGRADA: bias (m) written; BGRADB: bias (n) written
    // (sums over k; cuBLASLt overwrites, it does not accumulate).
    void *bias;     cudaDataType_t bias_type;
    // GELU_AUX*: the pre-activation (m, n) written; DGELU: read. Same dtype as D; ld % 8 == 0.
    void *aux;      int64_t ldaux;
} CudaGemm;

#ifdef __cplusplus
extern "C" {
#endif
// Runs g on the context's main stream and returns 1; returns 0 and runs nothing when cuBLASLt has
// no algorithm for it (a fused epilogue on a shape, dtype or alignment it does not support, or
// fused epilogues switched off): the caller then takes its unfused path.
int cuda_gemm_try(Ctx *ctx, const CudaGemm *g);
// cuda_gemm_try for a plain product: no algorithm is an error naming `what` and the shape.
void cuda_gemm(Ctx *ctx, const CudaGemm *g, const char *what);
// Which fused epilogues cuda_gemm_try may use; a product whose epilogue is not allowed returns 0
// and the op takes its unfused path (tests compare the two; the bench measures both).
enum {
    CUDA_FUSE_BIAS = 1,        // BIAS (and the bias of GELU_BIAS / GELU_AUX_BIAS)
    CUDA_FUSE_BIAS_GRAD = 2,   // BGRADA / BGRADB
    CUDA_FUSE_GELU = 4,        // GELU, GELU_AUX(_BIAS)
    CUDA_FUSE_DGELU = 8,       // DGELU
    CUDA_FUSE_DGELU_BGRAD = 16,   // DGELU_BGRAD: dpre and its column sums in one product
    // BGRADA / BGRADB on a product over at least CUDA_BGRAD_TALL_K whose m and n are at least
    // CUDA_BGRAD_MIN_MN (the dw product of a linear over that many rows, both widths not narrow):
    // there the column-sum kernel's extra read of dy costs more than the epilogue (H100, gspn_t
    // at 56^2, 401408 rows: in_proj dw + db 0.088 against 0.150 ms, fc1 0.154 against 0.285, fc2
    // 0.149 against 0.206), while at 100352 rows (28^2) the column sum is still faster (0.081
    // against 0.109, 0.155 against 0.174, 0.109 against 0.152; results/bench_gemm_h100.txt).
    // With a narrow side (the propagation's 2 proxy channels, its 28 gates) cuBLASLt's epilogue
    // kernels were two orders of magnitude slower: a gspn_t step took 198 ms instead of 36.
    CUDA_FUSE_BIAS_GRAD_TALL = 32,
    CUDA_FUSE_ALL = 63,
    // BGRADB is off by default: on the H200 the dw GEMM with it took longer than the dw GEMM plus
    // the separate column-sum kernel (ViT-B/16 qkv 0.377 vs 0.359 ms, so14 fc1 3.51 vs 3.20 ms);
    // so did BGRADA in a widening linear's transposed product (so14 fc1 3.66 vs 3.10 ms;
    // results/gemm_tune/bgrada_transposed_h200.txt).
    // DGELU_BGRAD is off too: in the so14 block at 2058 px (H200) linear_bwd+gelu_in took ~3-4 ms
    // longer with it, about what the column-sum kernel it replaces costs (block time unchanged).
    CUDA_FUSE_DEFAULT = CUDA_FUSE_BIAS | CUDA_FUSE_GELU | CUDA_FUSE_DGELU | CUDA_FUSE_BIAS_GRAD_TALL,
};
enum { CUDA_BGRAD_TALL_K = 1 << 18, CUDA_BGRAD_MIN_MN = 64 };
void cuda_gemm_set_fusion(Ctx *ctx, unsigned mask);
// Whether every CUDA_FUSE_* bit of `bits` is allowed; fused products outside cuBLASLt
// (kernels/cuda/gemm_cutlass.cu) ask before running and count their launches with
// cuda_gemm_count_fused, so the switch and cuda_gemm_cache_stats cover them too.
int cuda_gemm_fusion_allowed(Ctx *ctx, unsigned bits);
void cuda_gemm_count_fused(Ctx *ctx);
// A device buffer of at least `bytes` owned by the context's GEMM cache, valid until the next
// call (ops use it for bias-gradient vectors and column-sum partials on the main stream).
void *cuda_gemm_scratch(Ctx *ctx, size_t bytes);
// Frees the cache (called by cuda_ctx_destroy).
void cuda_gemm_cache_destroy(Ctx *ctx);
// Cached plans (keys), heuristic queries made, and launches with a fused epilogue so far: tests
// check the cache and report whether the fused paths ran on this GPU.
void cuda_gemm_cache_stats(Ctx *ctx, int *plans, long *queries, long *fused_launches);
#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
// ---- checks shared by the GEMM ops (C++ only: used by the .cu files) ---------------------------
#include "cuda_elem.cuh"   // cuda_check_tensor

static inline cudaDataType_t cuda_dtype_of(DType dt) {
    return dt == DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// t is on the GPU and has dtype dt.
static inline void cuda_check_dtype(const char *op, const char *name, const Tensor *t, DType dt) {
    cuda_check_tensor(op, name, t);
    CG_CHECK(t->dtype == dt, "activations, their gradients and parameters share act_dtype; "
             "parameter gradients are fp32",
             "op %s: %s is %s, expected %s", op, name, dtype_name(t->dtype), dtype_name(dt));
}

// t is on the GPU and reads as a (rows, cols) matrix.
static inline void cuda_check_matrix(const char *op, const char *name, const Tensor *t,
                                     size_t rows, int cols) {
    cuda_check_tensor(op, name, t);
    char buf[64];
    CG_CHECK(tensor_last(t) == cols && t->numel == rows * (size_t)cols, "",
             "op %s: %s has shape %s, expected %zu rows of %d (last dim %d)", op, name,
             tensor_shape_str(t, buf, sizeof buf), rows, cols, cols);
}
#endif

#ifdef __CUDACC__
// ---- element conversions for the GEMM ops' small kernels -----------------------------------------
static __device__ __forceinline__ float cuda_to_f32(float v) { return v; }
static __device__ __forceinline__ float cuda_to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> static __device__ __forceinline__ T cuda_from_f32(float v);
template <> __device__ __forceinline__ float cuda_from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 cuda_from_f32<__nv_bfloat16>(float v) {
    return __float2bfloat16(v);   // round to nearest even
}
// Blocks for a grid-stride loop over n elements with 256 threads (a few waves at most).
static inline unsigned cuda_grid_for(Ctx *ctx, size_t n) {
    size_t blocks = (n + 255) / 256, cap = (size_t)cuda_ctx_of(ctx)->sm_count * 16;
    return (unsigned)(blocks < 1 ? 1 : blocks < cap ? blocks : cap);
}
#endif
