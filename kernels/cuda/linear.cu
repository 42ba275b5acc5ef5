// CUDA linear layers through cuBLASLt (kernels/ops_list.h has the contracts; kernels/cpu/linear.c
// is the reference): linear_fwd and its fusions (the GELU on the output fused into the GEMM's
// epilogue, SiLU on the input, the sum onto a residual), and linear_bwd and its fusions (the
// backward of a linear that reads a GELU output with the GELU's derivative fused into its dx
// product: gelu_in).
//
// Row-major x (N,K), w (M,K), y (N,M) are, to column-major cuBLASLt, x^T (K,N), w^T (K,M),
// y^T (M,N), all with the row length as leading dimension. So
//   forward  y^T  (M,N) = (w^T)^T (M,K) x^T (K,N)    A = w  (trans), B = x,        bias (M) on rows
//   dx       dx^T (K,N) = w^T (K,M) dy^T (M,N)        A = w,          B = dy
//   dw       dw^T (K,M) = x^T (K,N) dy (N,M)          A = x,          B = dy (trans), db (M) =
//                                                     the sums of op(B) over k: BGRADB
// Precision: fp32 tensors compute in exact fp32 (CUBLAS_COMPUTE_32F, never TF32); bf16 tensors
// multiply on the tensor cores with fp32 accumulation and round once on output. dx accumulates
// through beta = 1 (one rounding of old + new); dw is fp32 and accumulates through beta = 1.
//
// Fused epilogues and their fallbacks (each fallback is exact to the same math; tests compare both):
// - BIAS in forward. Fallback: GEMM, then a bias-add kernel.
// - BGRADB in the dw product (kernels/cuda/cuda_gemm.h: by default only over at least
//   CUDA_BGRAD_TALL_K rows): cuBLASLt OVERWRITES the bias-gradient vector, and our db
//   accumulates, so it writes into an fp32 scratch vector (M floats) that a small kernel adds into
//   db. Measured (bench/cuda/gemm_bench.cu), the dw GEMM with BGRADB took longer than the plain dw
//   GEMM plus the column sum below except over very many rows, so the default elsewhere is the
//   column sum: a deterministic two-pass sum of dy (fixed row chunks, then the chunks in order),
//   which also serves db without dw.
// - GELU_AUX_BIAS in linear_fwd's gelu_out (pre written as aux, ld must be a multiple of 8, so
//   M % 8 == 0). cuBLASLt's GELU is the tanh approximation (GELU_TANH). Fallback: linear, then a
//   GELU kernel.
// - DGELU in linear_bwd's gelu_in dx product (aux = pre, K % 8 == 0). Fallback: the product in
//   fp32 into a temporary, then a kernel multiplies by gelu'(pre).
// The erf GELU (GELU_ERF, timm's default) has no cuBLASLt epilogue. In bf16 on sm_90 both products
// take CUTLASS kernels with the GELU (and gelu') in their epilogue (kernels/cuda/gemm_cutlass.cu, the
// same values); elsewhere gelu_out runs the GEMM with its bias fused into pre, then one GELU pass
// (pre -> y); gelu_in writes the dx product into dpre (beta = 0: no zeroing, no read of old
// values) and scales it in place by gelu'(pre) (kernels/cuda/gelu.h). That rounds the product to
// the activation dtype before the scaling, as an unfused linear + gelu backward (and PyTorch's
// bf16 autocast) does.
// cuBLASLt's own alignment rules (pointers, leading dimensions not a multiple of 8 elements) are
// handled by the heuristic: each plan is queried with the actual pointer alignment (see gemm.cu), and
// cuBLASLt then picks a kernel that supports it (slower, never wrong); a fused epilogue it refuses
// takes the fallback above. No padding copies are made.
#include "cuda_colsum.cuh"
#include "cuda_gemm.h"
#include "gelu.h"
#include "silu.h"
#include "narrow_dot.cuh"
#include "gemm_cutlass.h"
#include "mlp_fused.h"
#include "../ops.h"
#include "../elementwise_shape.h"
#include "../linear_shape.h"
#include "../layernorm_shape.h"
#include <limits.h>

// ---- small kernels -------------------------------------------------------------------------------

// y (N,M) += b (M) on every row
template <typename T>
__global__ void bias_add_kernel(T *y, const T *b, size_t n, int M) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = cuda_from_f32<T>(cuda_to_f32(y[i]) + cuda_to_f32(b[i % M]));
}

// dst += src
__global__ void add_f32_kernel(float *dst, const float *src, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i];
}

// y = gelu_tanh(pre) (in place when y == pre)
template <typename T>
__global__ void gelu_tanh_kernel(const T *pre, T *y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = cuda_from_f32<T>(gelu_value<GELU_TANH>(cuda_to_f32(pre[i])));
}

// out = g * gelu_tanh'(pre), written
template <typename G, typename T>
__global__ void dgelu_tanh_kernel(const G *g, const T *pre, T *out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = cuda_from_f32<T>(cuda_to_f32(g[i]) * gelu_slope<GELU_TANH>(cuda_to_f32(pre[i])));
}

// ---- shapes and checks -----------------------------------------------------------------------------

typedef struct LinearShape {
    size_t N;      // rows of x
    int K, M;      // in, out
    DType act;     // dtype of x, w, y, dx (and b)
} LinearShape;

// The shape checks both backends share are kernels/linear_shape.h's; the dtype rules and
// cuBLASLt's int range are this backend's.
static LinearShape linear_shape(const char *op, const Tensor *x, const Tensor *w) {
    cuda_check_tensor(op, "w", w);
    CG_CHECK(w->dtype == DTYPE_F32 || w->dtype == DTYPE_BF16, "", "op %s: w is %s", op,
             dtype_name(w->dtype));
    const LinearDims d = linear_dims(op, x, w);
    LinearShape s;
    s.M = d.M;
    s.K = d.K;
    s.act = w->dtype;
    cuda_check_dtype(op, "x", x, s.act);
    s.N = d.N;
    CG_CHECK(s.N <= INT_MAX, "reduce batch_size", "op %s: %zu rows exceed cuBLASLt's int range", op,
             s.N);
    return s;
}

static void check_bias(const char *op, const LinearShape *s, const Tensor *b) {
    cuda_check_dtype(op, "b", b, s->act);
    CG_CHECK(b->numel == (size_t)s->M, "", "op %s: b has %zu elements, w has %d outputs", op,
             b->numel, s->M);
}

static void check_param_grad(const char *op, const char *name, const Tensor *g, size_t numel) {
    cuda_check_dtype(op, name, g, DTYPE_F32);
    CG_CHECK(g->numel == numel, "", "op %s: %s has %zu elements, expected %zu", op, name, g->numel,
             numel);
}

// ---- the products ------------------------------------------------------------------------------

// y^T (M,N) = w x^T, no epilogue yet.
static CudaGemm gemm_forward(const LinearShape *s, const void *x, const void *w, void *y) {
    CudaGemm g;
    memset(&g, 0, sizeof g);
    cudaDataType_t t = cuda_dtype_of(s->act);
    g.trans_a = 1;
    g.m = s->M; g.n = (int)s->N; g.k = s->K;
    g.a = w; g.lda = s->K; g.a_type = t;
    g.b = x; g.ldb = s->K; g.b_type = t;
    g.d = y; g.ldd = s->M; g.d_type = t;
    return g;
}

// dx^T (K,N) [+]= w^T dy^T; out_type is the dtype of dx.
static CudaGemm gemm_dx(const LinearShape *s, const void *dy, const void *w, void *dx,
                        cudaDataType_t out_type, float beta) {
    CudaGemm g;
    memset(&g, 0, sizeof g);
    cudaDataType_t t = cuda_dtype_of(s->act);
    g.m = s->K; g.n = (int)s->N; g.k = s->M;
    g.a = w; g.lda = s->K; g.a_type = t;
    g.b = dy; g.ldb = s->M; g.b_type = t;
    g.d = dx; g.ldd = s->K; g.d_type = out_type;
    g.beta = beta;
    return g;
}

// dw^T (K,M) += x^T dy (fp32)
// dw^T (K,M) += x^T dy; transposed: d (M,K) = dy^T x written (dw's transpose, dw_transposed).
static CudaGemm gemm_dw(const LinearShape *s, const void *dy, const void *x, float *d,
                        bool transposed = false) {
    CudaGemm g;
    memset(&g, 0, sizeof g);
    cudaDataType_t t = cuda_dtype_of(s->act);
    const void *a = transposed ? dy : x, *b = transposed ? x : dy;
    int m = transposed ? s->M : s->K, n = transposed ? s->K : s->M;
    g.trans_b = 1;
    g.m = m; g.n = n; g.k = (int)s->N;
    g.a = a; g.lda = m; g.a_type = t;
    g.b = b; g.ldb = n; g.b_type = t;
    g.d = d; g.ldd = m; g.d_type = CUDA_R_32F;
    g.beta = transposed ? 0.0f : 1.0f;
    return g;
}

// y = x w^T + b, the bias fused when cuBLASLt can, else added by a kernel.
// The FLOPs of `products` (N,K) x (K,M) products, for the per-op profile (kernels/ctx.h).
static void report_flops(Ctx *ctx, const LinearShape *s, int products) {
    ctx_profile_flops(ctx, 2.0 * (double)s->N * s->K * s->M * products);
}

// ---- narrow inputs (K <= LINEAR_NARROW_K) -------------------------------------------------------
// A product over a handful of inputs (the propagation's 2 proxy channels into its gates and its up
// projection) moves y and nothing else of size: a thread makes 4 outputs of one row from the
// row's K inputs, in fp32, adds the bias and res (either may be NULL) and rounds once, as the
// GEMM's epilogue does. cuBLASLt took 0.076 ms for one up projection of gspn_t onto the fp32
// stream at 14^2 x 384 (batch 128; about 45% of the copy roofline).
enum { LINEAR_NARROW_K = 4 };

// f(std::integral_constant<int, n>{}) for n in 1 .. LINEAR_NARROW_K (the narrow kernels' width).
template <typename F> static void narrow_width(int n, F &&f) {
    switch (n) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{}); break;
    }
}

template <typename T, typename TY, int K>
__global__ void linear_narrow_kernel(const T *__restrict__ x, const T *__restrict__ w,
                                     const T *__restrict__ b, const TY *__restrict__ res,
                                     TY *__restrict__ y, size_t N, int M) {
    const int groups = M / 4;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < N * groups;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t n = e / groups;
        const int m = (int)(e - n * groups) * 4;
        float xv[K], out[4];
        #pragma unroll
        for (int k = 0; k < K; k++) xv[k] = load_or(x, n * K + k, 0.0f);
        #pragma unroll
        for (int j = 0; j < 4; j++) {
            float wv[K];
            #pragma unroll
            for (int k = 0; k < K; k++) wv[k] = load_or(w, (size_t)(m + j) * K + k, 0.0f);
            out[j] = narrow_dot<K>(xv, wv, load_or(b, m + j, 0.0f));
        }
        if (res) {
            float r[4];
            load_v<4>(res + n * M + m, r);
            #pragma unroll
            for (int j = 0; j < 4; j++) out[j] = r[j] + out[j];
        }
        store_v<4>(y + n * M + m, out);
    }
}

// y (+ res) through linear_narrow_kernel when the shape is narrow and y, res take 4-element
// vectors; returns whether it ran.
static bool linear_narrow(Ctx *ctx, const LinearShape *s, const void *x, const void *w,
                          const void *b, const void *res, void *y, DType ydt) {
    if (s->K > LINEAR_NARROW_K || s->M % 4 != 0 || !aligned16(y) || (res && !aligned16(res)))
        return false;
    const size_t n = s->N * (size_t)(s->M / 4);
    dispatch_dtype2(s->act, ydt, [&](auto tx, auto ty) {
        using T = TAG_T(tx);
        using TY = TAG_T(ty);
        auto go = [&](auto kc) {
            linear_narrow_kernel<T, TY, decltype(kc)::value><<<cuda_grid_for(ctx, n), 256, 0,
                                                               cuda_stream_of(ctx)>>>(
                (const T *)x, (const T *)w, (const T *)b, (const TY *)res, (TY *)y, s->N, s->M);
        };
        narrow_width(s->K, go);
    });
    CUDA_CHECK_LAUNCH();
    return true;
}

// The backward of a narrow product in one pass over dy: dx (N,K) (+)= dy w, dw (M,K) += dy^T x,
// db (M) += the column sums of dy. cuBLASLt's products with an output 2 wide (dx), or a reduction
// over all rows into 2 columns (dw), ran at about 3% of the copy roofline on gspn_t's gates and up
// projections. A thread takes 4 columns of a row; a group of Q lanes (Q a power of 2, at most 32,
// the fewest whose 4 Q columns cover M) takes a row, so a warp takes 32 / Q rows at a time.
// Block (column tile of 4 Q, row range): its NARROW_PHASES warps step through the range together.
// A thread sums dw and db for its columns over its rows in registers; per row, the group's partial
// dot products for dx (one per k) are summed by shuffles, and the group's first lane writes dx when
// one tile covers M, else the tile's partial (tiles, N, K) that linear_narrow_dx_kernel adds in
// tile order. dw and db: the row slots (phase, group) in order through shared memory, then the row
// ranges in order (cuda_sum_partials). Deterministic. dy may be fp32 under bf16 x and w (a
// residual stream's gradient): dx and dw then read it rounded to bf16, as a bf16 copy of it would
// hold, and db its fp32 values.
enum { NARROW_PHASES = 8, NARROW_TARGET_BLOCKS = 1024, NARROW_MIN_ROWS = 64 };

// Row ranges for a grid of `tiles` column tiles: about NARROW_TARGET_BLOCKS blocks, at least
// NARROW_MIN_ROWS rows a range (fewer would make the partials dominate); a function of the shape
// alone, so the sums' order is too.
static size_t narrow_row_splits(size_t N, size_t tiles, size_t *rows_per_split) {
    size_t splits = ceil_div((size_t)NARROW_TARGET_BLOCKS, tiles);
    const size_t most = ceil_div(N, (size_t)NARROW_MIN_ROWS);
    if (splits > most) splits = most;
    if (splits < 1) splits = 1;
    if (splits > 65535) splits = 65535;
    *rows_per_split = ceil_div(N, splits);
    return ceil_div(N, *rows_per_split);
}

template <typename TD, typename T, int K>
__global__ void __launch_bounds__(32 * NARROW_PHASES)
linear_narrow_bwd_kernel(const TD *__restrict__ dy, const T *__restrict__ x, const T *__restrict__ w,
                         size_t N, int M, int Q, size_t rows_per_split, T *__restrict__ dx,
                         float dx_beta, float *__restrict__ dx_part, float *__restrict__ part,
                         float *__restrict__ dw, float *__restrict__ db) {
    constexpr bool ROUND = std::is_same<TD, float>::value && std::is_same<T, bf16>::value;
    // (row slot, column entry): 32 NARROW_PHASES / Q slots of a tile's 4 Q columns, K dw sums and
    // db each: 4 (K + 1) floats a thread whatever Q is.
    __shared__ float sm[32 * NARROW_PHASES * 4 * (K + 1)];
    const int lane = threadIdx.x % 32, q = lane % Q, slot = threadIdx.x / Q;
    const int per_pass = 32 * NARROW_PHASES / Q;   // rows the block takes at a time
    const int tile_w = 4 * Q, m0 = blockIdx.x * tile_w + q * 4;
    const bool live = m0 < M;
    const size_t r0 = (size_t)blockIdx.y * rows_per_split;
    const size_t r1 = r0 + rows_per_split < N ? r0 + rows_per_split : N;
    float wv[4][K], sw[4][K], sb[4];
    #pragma unroll
    for (int j = 0; j < 4; j++) {
        sb[j] = 0.0f;
        #pragma unroll
        for (int k = 0; k < K; k++) {
            wv[j][k] = live ? cuda_to_f32(w[(size_t)(m0 + j) * K + k]) : 0.0f;
            sw[j][k] = 0.0f;
        }
    }
    // Every lane of a warp runs the same passes (its shuffles need all 32), rows past r1 as zeros.
    for (size_t base = r0; base < r1; base += per_pass) {
        const size_t r = base + slot;
        const bool row = r < r1;
        float g[4] = {0.0f, 0.0f, 0.0f, 0.0f}, xv[K];
        if (row && live) load_v<4>(dy + r * M + m0, g);
        #pragma unroll
        for (int k = 0; k < K; k++) xv[k] = row ? cuda_to_f32(x[r * K + k]) : 0.0f;
        float p[K];
        #pragma unroll
        for (int k = 0; k < K; k++) p[k] = 0.0f;
        #pragma unroll
        for (int j = 0; j < 4; j++) {
            sb[j] += g[j];
            const float gr = ROUND ? __bfloat162float(__float2bfloat16_rn(g[j])) : g[j];
            #pragma unroll
            for (int k = 0; k < K; k++) {
                sw[j][k] = fmaf(gr, xv[k], sw[j][k]);
                p[k] = fmaf(gr, wv[j][k], p[k]);
            }
        }
        if (!dx && !dx_part) continue;
        #pragma unroll
        for (int k = 0; k < K; k++)
            for (int o = Q / 2; o > 0; o /= 2) p[k] += __shfl_xor_sync(0xffffffffu, p[k], o);
        if (q != 0 || !row) continue;
        if (dx_part) {
            #pragma unroll
            for (int k = 0; k < K; k++) dx_part[((size_t)blockIdx.x * N + r) * K + k] = p[k];
        } else {
            #pragma unroll
            for (int k = 0; k < K; k++) {
                const float old = dx_beta != 0.0f ? cuda_to_f32(dx[r * K + k]) : 0.0f;
                dx[r * K + k] = cuda_from_f32<T>(old + p[k]);
            }
        }
    }
    if (!part && !dw && !db) return;
    const int width = tile_w * (K + 1);   // a slot's entries: column c's K dw sums, then its db
    #pragma unroll
    for (int j = 0; j < 4; j++) {
        #pragma unroll
        for (int k = 0; k < K; k++) sm[slot * width + (q * 4 + j) * (K + 1) + k] = sw[j][k];
        sm[slot * width + (q * 4 + j) * (K + 1) + K] = sb[j];
    }
    __syncthreads();
    // Thread t adds entry t of the tile over the slots, in order.
    for (int e = threadIdx.x; e < width; e += blockDim.x) {
        const int ml = e / (K + 1), k = e - ml * (K + 1), m = blockIdx.x * tile_w + ml;
        if (m >= M) continue;
        float t = sm[e];
        for (int y = 1; y < per_pass; y++) t += sm[y * width + e];
        // the row of partials: dw (M,K) then db (M)
        const size_t i = k < K ? (size_t)m * K + k : (size_t)M * K + m;
        if (part) part[(size_t)blockIdx.y * ((size_t)M * (K + 1)) + i] = t;
        else if (k < K) { if (dw) dw[i] += t; }
        else if (db) db[m] += t;
    }
}

// dx (N,K) = beta dx + the tiles' partials (tiles, N, K), added in tile order, rounded once.
template <typename T>
__global__ void linear_narrow_dx_kernel(const float *__restrict__ dx_part, int tiles, size_t n,
                                        T *__restrict__ dx, float dx_beta) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float t = dx_beta != 0.0f ? cuda_to_f32(dx[i]) : 0.0f;
        for (int tl = 0; tl < tiles; tl++) t += dx_part[(size_t)tl * n + i];
        dx[i] = cuda_from_f32<T>(t);
    }
}

// The narrow backward when the shape is narrow and dy takes 4-element vectors; returns whether it
// ran. dy_dt: dy's dtype (the activation dtype, or fp32 under bf16).
static bool linear_narrow_bwd(Ctx *ctx, const LinearShape *s, DType dy_dt, const void *dy,
                              const void *x, const void *w, void *dx, float *dw, float *db,
                              float dx_beta) {
    if (s->K > LINEAR_NARROW_K || s->M % 4 != 0 || !aligned16(dy)) return false;
    int Q = 1;
    while (Q < 32 && 4 * Q < s->M) Q *= 2;
    const unsigned tiles = (unsigned)ceil_div((size_t)s->M, (size_t)(4 * Q));
    size_t rows_per_split;
    const size_t splits = narrow_row_splits(s->N, tiles, &rows_per_split);
    const size_t width = (size_t)s->M * (s->K + 1);
    float *part = splits > 1 && (dw || db) ? (float *)cuda_temp_alloc(ctx, splits * width * sizeof(float)) : nullptr;
    float *dx_part = dx && tiles > 1 ? (float *)cuda_temp_alloc(ctx, tiles * s->N * s->K * sizeof(float)) : nullptr;
    cudaStream_t st = cuda_stream_of(ctx);
    dispatch_dtype2(dy_dt, s->act, [&](auto td, auto ta) {
        using TD = TAG_T(td);
        using T = TAG_T(ta);
        auto go = [&](auto kc) {
            linear_narrow_bwd_kernel<TD, T, decltype(kc)::value>
                <<<dim3(tiles, (unsigned)splits), 32 * NARROW_PHASES, 0, st>>>(
                    (const TD *)dy, (const T *)x, (const T *)w, s->N, s->M, Q, rows_per_split,
                    dx_part ? nullptr : (T *)dx, dx_beta, dx_part, part, dw, db);
        };
        narrow_width(s->K, go);
        CUDA_CHECK_LAUNCH();
        if (dx_part) {
            const size_t n = s->N * s->K;
            linear_narrow_dx_kernel<T><<<cuda_grid_for(ctx, n), 256, 0, st>>>(dx_part, (int)tiles, n,
                                                                               (T *)dx, dx_beta);
            CUDA_CHECK_LAUNCH();
        }
    });
    if (part) cuda_sum_partials(ctx, part, (unsigned)splits, width, (size_t)s->M * s->K, dw, db);
    if (part) cuda_temp_free(ctx, part);
    if (dx_part) cuda_temp_free(ctx, dx_part);
    return true;
}

// ---- narrow outputs (M <= LINEAR_NARROW_K) ------------------------------------------------------
// A product into a handful of outputs (the propagation's down projection, 1.5 C_s -> 2 proxy
// channels) reads x and little else: cuBLASLt ran it at about 46% of the copy roofline forward
// and 21-30% backward on gspn_t.
// Forward: a group of Q lanes takes a row, each lane 8 inputs (a chunk) at a time (16-byte
// loads) against w staged in shared memory as fp32 (M, 8, K / 8): input j of chunk c of output m
// at (m 8 + j) K / 8 + c, so the lanes of a group, on consecutive chunks, read consecutive words
// (w's own layout put them 8 words apart: 8-way bank conflicts, slower than cuBLASLt). The group's
// M dot products are summed by shuffles; y is rounded once.
template <typename T, int M, bool SILU>
__global__ void __launch_bounds__(256)
linear_narrow_out_kernel(const T *__restrict__ x, const T *__restrict__ w, const T *__restrict__ b,
                         T *__restrict__ y, size_t N, int K, int Q) {
    extern __shared__ float narrow_ws[];   // (M, 8, K / 8)
    const int CH = K / 8;
    for (int e = threadIdx.x; e < M * K; e += blockDim.x) {
        const int m = e / K, k = e - m * K;
        narrow_ws[(m * 8 + k % 8) * CH + k / 8] = cuda_to_f32(w[e]);
    }
    __syncthreads();
    const int lane = threadIdx.x % 32, q = lane % Q, rows_per_warp = 32 / Q;
    const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32;
    const size_t warps = (size_t)gridDim.x * blockDim.x / 32;
    // Every lane of a warp runs the same passes (its shuffles need all 32), rows past N as zeros.
    for (size_t base = warp * rows_per_warp; base < N; base += warps * rows_per_warp) {
        const size_t r = base + lane / Q;
        float p[M];
        #pragma unroll
        for (int m = 0; m < M; m++) p[m] = 0.0f;
        if (r < N)
            for (int c = q; c < CH; c += Q) {
                float xv[8];
                load_v<8>(x + r * K + c * 8, xv);
                if (SILU) {   // silu(x) as silu_fwd would store it
                    #pragma unroll
                    for (int j = 0; j < 8; j++) xv[j] = cuda_to_f32(cuda_from_f32<T>(silu_value(xv[j])));
                }
                #pragma unroll
                for (int m = 0; m < M; m++)
                    #pragma unroll
                    for (int j = 0; j < 8; j++) p[m] = fmaf(xv[j], narrow_ws[(m * 8 + j) * CH + c], p[m]);
            }
        #pragma unroll
        for (int m = 0; m < M; m++)
            for (int o = Q / 2; o > 0; o /= 2) p[m] += __shfl_xor_sync(0xffffffffu, p[m], o);
        if (q == 0 && r < N) {
            #pragma unroll
            for (int m = 0; m < M; m++) y[r * M + m] = cuda_from_f32<T>(p[m] + (b ? cuda_to_f32(b[m]) : 0.0f));
        }
    }
}

// Backward: dx (N,K) (+)= dy w, dw (M,K) += dy^T x, db (M) += the column sums of dy. A block of
// CH R threads (CH = K / 8 chunks of a row, R rows at a time) takes a range of rows: thread t owns
// chunk t % CH of row slot t / CH, so it writes its dx chunk whole (no reduction) and sums dw for
// its chunk (and, for chunk 0, db) over its rows in registers; the slots then add in order through
// shared memory and the ranges in order (cuda_sum_partials). dy may be fp32 under bf16 x and w, as
// for linear_narrow_bwd.
enum { NARROW_OUT_THREADS = 256 };
template <typename TD, typename T, int M, bool SILU>
__global__ void __launch_bounds__(NARROW_OUT_THREADS)
linear_narrow_out_bwd_kernel(const TD *__restrict__ dy, const T *__restrict__ x, const T *__restrict__ w,
                             size_t N, int K, size_t rows_per_split, T *__restrict__ dx, float dx_beta,
                             float *__restrict__ part, float *__restrict__ dw, float *__restrict__ db) {
    constexpr bool ROUND = std::is_same<TD, float>::value && std::is_same<T, bf16>::value;
    extern __shared__ float narrow_sm[];   // (R, M K + M): a slot's dw (M,K) and db (M)
    const int CH = K / 8, R = blockDim.x / CH, c = threadIdx.x % CH, slot = threadIdx.x / CH;   // blockDim = CH R
    const size_t r0 = (size_t)blockIdx.x * rows_per_split;
    const size_t r1 = r0 + rows_per_split < N ? r0 + rows_per_split : N;
    float wv[M][8], sw[M][8], sb[M];
    #pragma unroll
    for (int m = 0; m < M; m++) {
        sb[m] = 0.0f;
        load_v<8>(w + (size_t)m * K + c * 8, wv[m]);
        #pragma unroll
        for (int j = 0; j < 8; j++) sw[m][j] = 0.0f;
    }
    for (size_t r = r0 + slot; r < r1; r += R) {
        float g[M], xv[8], d[8];
        #pragma unroll
        for (int m = 0; m < M; m++) {
            const float v = cuda_to_f32(dy[r * M + m]);
            sb[m] += v;
            g[m] = ROUND ? __bfloat162float(__float2bfloat16_rn(v)) : v;
        }
        load_v<8>(x + r * K + c * 8, xv);
        float a[8];   // the linear's input: x, or silu(x) as silu_fwd would store it
        #pragma unroll
        for (int j = 0; j < 8; j++) {
            a[j] = SILU ? cuda_to_f32(cuda_from_f32<T>(silu_value(xv[j]))) : xv[j];
            d[j] = 0.0f;
        }
        #pragma unroll
        for (int m = 0; m < M; m++)
            #pragma unroll
            for (int j = 0; j < 8; j++) {
                sw[m][j] = fmaf(g[m], a[j], sw[m][j]);
                d[j] = fmaf(g[m], wv[m][j], d[j]);
            }
        if (dx) {
            if (SILU) {   // (dy w) as linear_bwd would store it, times silu'(x)
                #pragma unroll
                for (int j = 0; j < 8; j++) d[j] = cuda_to_f32(cuda_from_f32<T>(d[j])) * silu_slope(xv[j]);
            }
            if (dx_beta != 0.0f) {
                float old[8];
                load_v<8>(dx + r * K + c * 8, old);
                #pragma unroll
                for (int j = 0; j < 8; j++) d[j] += old[j];
            }
            store_v<8>(dx + r * K + c * 8, d);
        }
    }
    if (!part && !dw && !db) return;
    const int width = M * K + M;
    #pragma unroll
    for (int m = 0; m < M; m++) {
        #pragma unroll
        for (int j = 0; j < 8; j++) narrow_sm[slot * width + m * K + c * 8 + j] = sw[m][j];
        if (c == 0) narrow_sm[slot * width + M * K + m] = sb[m];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < width; e += CH * R) {
        float t = narrow_sm[e];
        for (int y = 1; y < R; y++) t += narrow_sm[y * width + e];
        if (part) part[(size_t)blockIdx.x * width + e] = t;
        else if (e < M * K) { if (dw) dw[e] += t; }
        else if (db) db[e - M * K] += t;
    }
}

// The narrow-output forward, when M <= LINEAR_NARROW_K and x takes 16-byte loads; returns whether
// it ran.
static bool linear_narrow_out(Ctx *ctx, const LinearShape *s, const void *x, const void *w,
                              const void *b, void *y, bool silu = false) {
    if (s->M > LINEAR_NARROW_K || s->K <= LINEAR_NARROW_K || s->K % 8 != 0 || !aligned16(x) ||
        !aligned16(w) || (size_t)s->M * s->K * sizeof(float) > 48 * 1024)
        return false;
    // Lanes a row: the largest power of two up to 32 that divides the row's chunks, so every lane
    // of a group loads on every pass (36 chunks over 32 lanes left 28 idle on the second pass and
    // ran gspn_t's 28^2 down projection 15% slower than cuBLASLt).
    const int CH = s->K / 8;
    int Q = 1;
    while (Q < 32 && CH % (2 * Q) == 0) Q *= 2;
    const unsigned blocks = cuda_grid_for(ctx, s->N * Q);   // Q threads a row, grid-stride
    const size_t smem = (size_t)s->M * s->K * sizeof(float);
    dispatch_dtype(s->act, [&](auto ta) {
        using T = TAG_T(ta);
        auto go = [&](auto mc) {
            constexpr int M = decltype(mc)::value;
            auto kernel = silu ? linear_narrow_out_kernel<T, M, true> : linear_narrow_out_kernel<T, M, false>;
            kernel<<<blocks, 256, smem, cuda_stream_of(ctx)>>>((const T *)x, (const T *)w, (const T *)b,
                                                               (T *)y, s->N, s->K, Q);
        };
        narrow_width(s->M, go);
    });
    CUDA_CHECK_LAUNCH();
    return true;
}

// The narrow-output backward, when M <= LINEAR_NARROW_K, K is 8 to 2048 in steps of 8 and x, w,
// dx take 16-byte accesses; returns whether it ran.
static bool linear_narrow_out_bwd(Ctx *ctx, const LinearShape *s, DType dy_dt, const void *dy,
                                  const void *x, const void *w, void *dx, float *dw, float *db,
                                  float dx_beta, bool silu = false) {
    const int CH = s->K / 8;
    if (s->M > LINEAR_NARROW_K || s->K <= LINEAR_NARROW_K || s->K % 8 != 0 || CH > NARROW_OUT_THREADS ||
        !aligned16(x) || !aligned16(w) || (dx && !aligned16(dx)))
        return false;
    const int R = NARROW_OUT_THREADS / CH;
    const size_t width = (size_t)s->M * s->K + s->M, smem = (size_t)R * width * sizeof(float);
    if (smem > 48 * 1024) return false;
    size_t rows_per_split;
    const size_t splits = narrow_row_splits(s->N, 1, &rows_per_split);
    float *part = splits > 1 && (dw || db) ? (float *)cuda_temp_alloc(ctx, splits * width * sizeof(float)) : nullptr;
    dispatch_dtype2(dy_dt, s->act, [&](auto td, auto ta) {
        using TD = TAG_T(td);
        using T = TAG_T(ta);
        auto go = [&](auto mc) {
            constexpr int M = decltype(mc)::value;
            auto kernel = silu ? linear_narrow_out_bwd_kernel<TD, T, M, true>
                               : linear_narrow_out_bwd_kernel<TD, T, M, false>;
            kernel<<<(unsigned)splits, CH * R, smem, cuda_stream_of(ctx)>>>(
                (const TD *)dy, (const T *)x, (const T *)w, s->N, s->K, rows_per_split, (T *)dx,
                dx_beta, part, dw, db);
        };
        narrow_width(s->M, go);
    });
    CUDA_CHECK_LAUNCH();
    if (part) {
        cuda_sum_partials(ctx, part, (unsigned)splits, width, (size_t)s->M * s->K, dw, db);
        cuda_temp_free(ctx, part);
    }
    return true;
}

static void linear_forward(Ctx *ctx, const LinearShape *s, const void *x, const void *w,
                           const void *b, void *y) {
    report_flops(ctx, s, 1);
    if (linear_narrow(ctx, s, x, w, b, NULL, y, s->act)) return;
    if (linear_narrow_out(ctx, s, x, w, b, y)) return;
    CudaGemm g = gemm_forward(s, x, w, y);
    if (b) {
        g.epilogue = CUBLASLT_EPILOGUE_BIAS;
        g.bias = (void *)b;
        g.bias_type = g.d_type;
        if (cuda_gemm_try(ctx, &g)) return;
        g.epilogue = (cublasLtEpilogue_t)0;
        g.bias = NULL;
    }
    cuda_gemm(ctx, &g, "linear_fwd");
    if (!b) return;
    size_t n = s->N * (size_t)s->M;
    cudaStream_t st = cuda_stream_of(ctx);
    if (s->act == DTYPE_BF16)
        bias_add_kernel<<<cuda_grid_for(ctx, n), 256, 0, st>>>((__nv_bfloat16 *)y,
                                                              (const __nv_bfloat16 *)b, n, s->M);
    else
        bias_add_kernel<<<cuda_grid_for(ctx, n), 256, 0, st>>>((float *)y, (const float *)b, n, s->M);
    CUDA_CHECK_LAUNCH();
}

// db (M) += column sums of dy (N,M), in a fixed order (kernels/cuda/cuda_colsum.cuh).
static void colsum_add(Ctx *ctx, const LinearShape *s, const void *dy, float *db) {
    bool vec = s->M % 8 == 0 && aligned16(dy);
    if (s->act == DTYPE_BF16)
        launch_colsum(ctx, s->N, (size_t)s->M, vec, ColsumRows<bf16>{(const bf16 *)dy, (size_t)s->M}, db);
    else
        launch_colsum(ctx, s->N, (size_t)s->M, vec, ColsumRows<float>{(const float *)dy, (size_t)s->M}, db);
}

// dw (M,K) += t^T for t (K,M) row-major: 32 x 32 tiles through shared memory (both sides
// coalesced).
__global__ void add_transposed_kernel(float *dw, const float *t, int M, int K) {
    __shared__ float tile[32][33];
    int m0 = blockIdx.y * 32, k0 = blockIdx.x * 32;
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
        int k = k0 + i, m = m0 + threadIdx.x;
        if (k < K && m < M) tile[i][threadIdx.x] = t[(size_t)k * M + m];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
        int m = m0 + i, k = k0 + threadIdx.x;
        if (m < M && k < K) dw[(size_t)m * K + k] += tile[threadIdx.x][i];
    }
}

// dw += dy^T x as the transposed product t = x^T dy into fp32 scratch (column-major (M,K): the
// larger of the two output dims as cuBLASLt's m), then added transposed. For a linear that widens
// (M > K: fc1, qkv) the direct product has the narrow side as m, which the H100 ran 24% slower
// (so14 fc1 at 74^2: 3.26 ms against 2.63 ms for the same product the other way round; the H200
// 2%). The extra pass moves 3 x M x K floats. With db, the bias gradient comes from the same
// product when fused epilogues allow it (BGRADA: the sums of op(A) = dy^T over k; it overwrites
// its vector, so into scratch, then added); returns whether it did.
static bool dw_transposed(Ctx *ctx, const LinearShape *s, const void *dy, const void *x, float *dw,
                          float *db) {
    float *t = (float *)cuda_gemm_scratch(ctx, ((size_t)s->M * s->K + s->M) * sizeof(float));
    float *bias = t + (size_t)s->M * s->K;
    CudaGemm g = gemm_dw(s, dy, x, t, true);
    bool db_done = false;
    if (db) {
        g.epilogue = CUBLASLT_EPILOGUE_BGRADA;
        g.bias = bias;
        g.bias_type = CUDA_R_32F;
        db_done = cuda_gemm_try(ctx, &g);
        g.epilogue = (cublasLtEpilogue_t)0;
        g.bias = NULL;
    }
    if (!db_done) cuda_gemm(ctx, &g, "linear_bwd dw (transposed)");
    cudaStream_t st = cuda_stream_of(ctx);
    dim3 grid((unsigned)ceil_div((size_t)s->K, 32), (unsigned)ceil_div((size_t)s->M, 32)), block(32, 8);
    add_transposed_kernel<<<grid, block, 0, st>>>(dw, t, s->M, s->K);
    CUDA_CHECK_LAUNCH();
    if (db_done) {
        add_f32_kernel<<<(s->M + 255) / 256, 256, 0, st>>>(db, bias, s->M);
        CUDA_CHECK_LAUNCH();
    }
    return db_done;
}

// dx (+)= dy w (dx_beta 1: added, 0: written); dw += dy^T x; db += sum_n dy (shapes checked by
// the caller).
static void linear_backward(Ctx *ctx, const LinearShape *s, const void *dy, const void *x,
                            const void *w, void *dx, float *dw, float *db, float dx_beta = 1.0f) {
    if (s->N == 0) return;
    report_flops(ctx, s, (dx ? 1 : 0) + (dw ? 1 : 0));
    if (dx) {
        CudaGemm g = gemm_dx(s, dy, w, dx, cuda_dtype_of(s->act), dx_beta);
        cuda_gemm(ctx, &g, "linear_bwd dx");
    }
    int db_done = 0;
    if (dw && s->M > s->K) {
        db_done = dw_transposed(ctx, s, dy, x, dw, db);
    } else if (dw) {
        CudaGemm g = gemm_dw(s, dy, x, dw);
        int dw_done = 0;
        if (db) {   // BGRADB overwrites its vector: fp32 scratch, then db += scratch
            float *tmp = (float *)cuda_gemm_scratch(ctx, (size_t)s->M * sizeof(float));
            g.epilogue = CUBLASLT_EPILOGUE_BGRADB;
            g.bias = tmp;
            g.bias_type = CUDA_R_32F;
            if (cuda_gemm_try(ctx, &g)) {
                add_f32_kernel<<<(s->M + 255) / 256, 256, 0, cuda_stream_of(ctx)>>>(db, tmp, s->M);
                CUDA_CHECK_LAUNCH();
                dw_done = db_done = 1;
            }
            g.epilogue = (cublasLtEpilogue_t)0;
            g.bias = NULL;
        }
        if (!dw_done) cuda_gemm(ctx, &g, "linear_bwd dw");
    }
    if (db && !db_done) colsum_add(ctx, s, dy, db);
}

// ---- ops -----------------------------------------------------------------------------------------

// y = x w^T + b
static void plain_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, Tensor *y) {
    LinearShape s = linear_shape("linear_fwd", x, w);
    cuda_check_matrix("linear_fwd", "y", y, s.N, s.M);
    cuda_check_dtype("linear_fwd", "y", y, s.act);
    if (b) check_bias("linear_fwd", &s, b);
    if (s.N == 0) return;
    linear_forward(ctx, &s, x->data, w->data, b ? b->data : NULL, y->data);
}

// y = res + x w^T + b: one GEMM with res as C (beta = 1) and the bias in the epilogue, y and res
// in their own dtype (fp32 in the encoders). Fallback (no such cuBLASLt algorithm): the linear
// into an activation-dtype temporary, then the add (the unfused ops' numbers exactly).
static void res_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b,
                    const Tensor *res, Tensor *y) {
    const char *op = "linear_fwd";
    LinearShape s = linear_shape(op, x, w);
    cuda_check_matrix(op, "y", y, s.N, s.M);
    cuda_check_matrix(op, "res", res, s.N, s.M);
    CG_CHECK(res->dtype == y->dtype && res->data != y->data, "",
             "op %s: res and y must share a dtype and not alias", op);
    if (b) check_bias(op, &s, b);
    if (s.N == 0) return;
    if (linear_narrow(ctx, &s, x->data, w->data, b ? b->data : NULL, res->data, y->data, y->dtype)) {
        report_flops(ctx, &s, 1);
        return;
    }
    // bf16 onto the fp32 stream: CUTLASS's product with fp32 C and D (the stream read and written
    // once; cuBLASLt's ran at 62% of the copy roofline on gspn_t's fc2, this at 77%)
    if (s.act == DTYPE_BF16 && y->dtype == DTYPE_F32 && b && b->dtype == DTYPE_BF16 &&
        cuda_gemm_fusion_allowed(ctx, CUDA_FUSE_BIAS) &&
        cuda_gemm_residual_fwd(ctx, (const bf16 *)x->data, (const bf16 *)w->data, (const bf16 *)b->data,
                               (const float *)res->data, (float *)y->data, (int)s.N, s.K, s.M)) {
        cuda_gemm_count_fused(ctx);
        report_flops(ctx, &s, 1);
        return;
    }
    CudaGemm g = gemm_forward(&s, x->data, w->data, y->data);
    g.d_type = cuda_dtype_of(y->dtype);
    g.c = res->data;
    g.ldc = s.M;
    g.beta = 1.0f;
    if (b) {
        g.epilogue = CUBLASLT_EPILOGUE_BIAS;
        g.bias = b->data;
        g.bias_type = cuda_dtype_of(b->dtype);
    }
    if (cuda_gemm_try(ctx, &g)) {
        report_flops(ctx, &s, 1);
        return;
    }
    void *tmp = cuda_temp_alloc(ctx, s.N * (size_t)s.M * dtype_size(s.act));
    linear_forward(ctx, &s, x->data, w->data, b ? b->data : NULL, tmp);
    Tensor branch = *y;
    branch.data = tmp;
    branch.dtype = s.act;
    cuda_add_fwd(ctx, res, &branch, y);
    cuda_temp_free(ctx, tmp);
}

static void linear_bwd_op(const char *op, Ctx *ctx, const Tensor *dy, const Tensor *x,
                          const Tensor *w, Tensor *dx, Tensor *dw, Tensor *db, float dx_beta) {
    LinearShape s = linear_shape(op, x, w);
    cuda_check_matrix(op, "dy", dy, s.N, s.M);
    CG_CHECK(dy->dtype == s.act || (dy->dtype == DTYPE_F32 && s.act == DTYPE_BF16), "",
             "op %s: dy is %s with %s x and w (it may be their dtype, or fp32 under bf16)", op,
             dtype_name(dy->dtype), dtype_name(s.act));
    if (dx) {
        cuda_check_dtype(op, "dx", dx, s.act);
        char a[64], c[64];
        CG_CHECK(tensor_same_shape(dx, x), "", "op %s: dx has shape %s, x has shape %s", op,
                 tensor_shape_str(dx, a, sizeof a), tensor_shape_str(x, c, sizeof c));
    }
    if (dw) check_param_grad(op, "dw", dw, (size_t)s.M * s.K);
    if (db) check_param_grad(op, "db", db, (size_t)s.M);
    if (s.N == 0) return;
    void *pdx = dx ? dx->data : NULL;
    float *pdw = dw ? (float *)dw->data : NULL, *pdb = db ? (float *)db->data : NULL;
    if (linear_narrow_bwd(ctx, &s, dy->dtype, dy->data, x->data, w->data, pdx, pdw, pdb, dx_beta) ||
        linear_narrow_out_bwd(ctx, &s, dy->dtype, dy->data, x->data, w->data, pdx, pdw, pdb, dx_beta)) {
        report_flops(ctx, &s, (dx ? 1 : 0) + (dw ? 1 : 0));
        return;
    }
    if (dy->dtype == s.act) {
        linear_backward(ctx, &s, dy->data, x->data, w->data, pdx, pdw, pdb, dx_beta);
        return;
    }
    // fp32 dy under bf16: a bf16 copy for the products, db from the fp32 values on the way.
    Tensor g = *dy;
    g.dtype = s.act;
    g.data = cuda_temp_alloc(ctx, tensor_bytes(&g));
    cuda_cast_colsum(ctx, dy, &g, db);
    linear_backward(ctx, &s, g.data, x->data, w->data, pdx, pdw, NULL, dx_beta);
    cuda_temp_free(ctx, g.data);
}

// y = silu(x) w^T + b: silu on the fly in the narrow-output kernel, else silu_fwd into a
// temporary and the linear.
static void silu_in_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, Tensor *y) {
    const char *op = "linear_fwd";
    LinearShape s = linear_shape(op, x, w);
    cuda_check_matrix(op, "y", y, s.N, s.M);
    cuda_check_dtype(op, "y", y, s.act);
    if (b) check_bias(op, &s, b);
    if (s.N == 0) return;
    if (linear_narrow_out(ctx, &s, x->data, w->data, b ? b->data : NULL, y->data, true)) {
        report_flops(ctx, &s, 1);
        return;
    }
    Tensor a = *x;
    a.data = cuda_temp_alloc(ctx, tensor_bytes(x));
    cuda_silu_fwd(ctx, x, &a);
    linear_forward(ctx, &s, a.data, w->data, b ? b->data : NULL, y->data);
    cuda_temp_free(ctx, a.data);
}

// dx = (dy w) * silu'(x), dw += dy^T silu(x), db += sum_n dy: one pass in the narrow-output
// kernel, else silu_fwd into a temporary, linear_bwd's products, and silu_bwd.
static void silu_in_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w, Tensor *dx,
                        Tensor *dw, Tensor *db) {
    const char *op = "linear_bwd";
    LinearShape s = linear_shape(op, x, w);
    cuda_check_matrix(op, "dy", dy, s.N, s.M);
    cuda_check_dtype(op, "dy", dy, s.act);
    if (dx) {
        cuda_check_dtype(op, "dx", dx, s.act);
        CG_CHECK(dx->numel == x->numel, "", "op %s: dx has %zu elements, x %zu", op, dx->numel, x->numel);
    }
    if (dw) check_param_grad(op, "dw", dw, (size_t)s.M * s.K);
    if (db) check_param_grad(op, "db", db, (size_t)s.M);
    if (s.N == 0 || (!dx && !dw && !db)) return;
    void *pdx = dx ? dx->data : NULL;
    float *pdw = dw ? (float *)dw->data : NULL, *pdb = db ? (float *)db->data : NULL;
    if (linear_narrow_out_bwd(ctx, &s, dy->dtype, dy->data, x->data, w->data, pdx, pdw, pdb, 0.0f, true)) {
        report_flops(ctx, &s, (dx ? 1 : 0) + (dw ? 1 : 0));
        return;
    }
    Tensor a = *x, g = *x;
    a.data = cuda_temp_alloc(ctx, tensor_bytes(x));
    g.data = dx ? cuda_temp_alloc(ctx, tensor_bytes(x)) : NULL;
    cuda_silu_fwd(ctx, x, &a);
    linear_backward(ctx, &s, dy->data, a.data, w->data, g.data, pdw, pdb, 0.0f);
    if (dx) {
        cuda_zero(ctx, dx);
        cuda_silu_bwd(ctx, &g, x, dx);
        cuda_temp_free(ctx, g.data);
    }
    cuda_temp_free(ctx, a.data);
}

// pre = x w^T + b (pre NULL: not kept), y = gelu(pre)
static void gelu_out_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, GeluKind kind,
                         Tensor *pre, Tensor *y) {
    const char *op = "linear_fwd";
    gelu_check_kind(op, kind);
    LinearShape s = linear_shape(op, x, w);
    cuda_check_matrix(op, "y", y, s.N, s.M);
    cuda_check_dtype(op, "y", y, s.act);
    if (pre) {
        cuda_check_matrix(op, "pre", pre, s.N, s.M);
        cuda_check_dtype(op, "pre", pre, s.act);
    }
    if (b) check_bias(op, &s, b);
    if (s.N == 0) return;
    if (kind == GELU_ERF) {   // GEMM + bias + GELU in one CUTLASS product, else GEMM + bias, GELU pass
        if (s.act == DTYPE_BF16 && w->dtype == DTYPE_BF16 && b && b->dtype == DTYPE_BF16 &&
            cuda_gemm_fusion_allowed(ctx, CUDA_FUSE_GELU) &&
            cuda_gemm_gelu_erf_fwd(ctx, (const bf16 *)x->data, (const bf16 *)w->data, (const bf16 *)b->data,
                                   pre ? (bf16 *)pre->data : NULL, (bf16 *)y->data, s.N, s.K, s.M)) {
            cuda_gemm_count_fused(ctx);
            report_flops(ctx, &s, 1);
            return;
        }
        void *p = pre ? pre->data : y->data;
        linear_forward(ctx, &s, x->data, w->data, b ? b->data : NULL, p);
        cuda_gelu_apply(ctx, GELU_ERF, s.act, p, y->data, s.N * (size_t)s.M);
        return;
    }

    CudaGemm g = gemm_forward(&s, x->data, w->data, y->data);
    g.bias = b ? b->data : NULL;
    g.bias_type = g.d_type;
    if (pre) {
        g.epilogue = b ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        g.aux = pre->data;
        g.ldaux = s.M;
    } else {
        g.epilogue = b ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    }
    if (cuda_gemm_try(ctx, &g)) {
        report_flops(ctx, &s, 1);
        return;
    }

    // Unfused: pre = x w^T + b (into y when pre is not kept), then y = gelu(pre).
    void *p = pre ? pre->data : y->data;
    linear_forward(ctx, &s, x->data, w->data, b ? b->data : NULL, p);
    size_t n = s.N * (size_t)s.M;
    cudaStream_t st = cuda_stream_of(ctx);
    if (s.act == DTYPE_BF16)
        gelu_tanh_kernel<<<cuda_grid_for(ctx, n), 256, 0, st>>>((const __nv_bfloat16 *)p,
                                                               (__nv_bfloat16 *)y->data, n);
    else
        gelu_tanh_kernel<<<cuda_grid_for(ctx, n), 256, 0, st>>>((const float *)p, (float *)y->data, n);
    CUDA_CHECK_LAUNCH();
}

// y = res + MLP(x): one kernel with the hidden activation on chip where it applies
// (kernels/cuda/mlp_fused.h: the erf GELU, bf16 x and weights with both biases, fp32 res and y,
// gspn_t/s/b's widths at 56^2 and 28^2; with norm, fp32 norm weights), else layernorm_fwd into a
// buffer (with norm), linear_fwd with gelu_out into a buffer, then linear_fwd onto res.
extern "C" void cuda_mlp_residual_fwd(Ctx *ctx, const Tensor *x, const MlpInputNorm *norm,
                                      const Tensor *w1, const Tensor *b1, const Tensor *w2,
                                      const Tensor *b2, GeluKind kind, const Tensor *res, Tensor *y) {
    const char *op = "mlp_residual_fwd";
    CG_CHECK(!norm == !!x, "", "op %s: x and norm go one without the other (norm: x is layernorm(res))", op);
    Tensor xn;   // with norm: layernorm(res) (N, C) in w1's dtype, made only where no kernel fuses it
    if (norm) {
        cuda_check_tensor(op, "res", res);
        xn = *res;
        xn.dtype = w1->dtype;
        xn.data = NULL;
        xn.grad = NULL;
        x = &xn;
        layernorm_fwd_dims(op, res, NULL, norm->w, norm->b, norm->eps, NULL, &xn, NULL, NULL);
        if (norm->w) cuda_check_tensor(op, "norm w", norm->w);
        if (norm->b) cuda_check_tensor(op, "norm b", norm->b);
    }
    LinearShape s1 = linear_shape(op, x, w1);
    CG_CHECK(w2->ndim == 2 && w2->shape[0] == s1.K && w2->shape[1] == s1.M, "",
             "op %s: fc1 is (%d, %d), fc2 must be (%d, %d)", op, s1.M, s1.K, s1.K, s1.M);
    cuda_check_matrix(op, "res", res, s1.N, s1.K);
    cuda_check_matrix(op, "y", y, s1.N, s1.K);
    if (s1.N == 0) return;
    const bool norm_f32 = norm && norm->w && norm->b && norm->w->dtype == DTYPE_F32 &&
                          norm->b->dtype == DTYPE_F32;
    const MlpFusedNorm fused_norm = {norm_f32 ? tensor_f32(norm->w) : NULL,
                                     norm_f32 ? tensor_f32(norm->b) : NULL, norm ? norm->eps : 0.0f};
    if (kind == GELU_ERF && s1.act == DTYPE_BF16 && w2->dtype == DTYPE_BF16 && b1 && b2 &&
        b1->dtype == DTYPE_BF16 && b2->dtype == DTYPE_BF16 && res->dtype == DTYPE_F32 &&
        y->dtype == DTYPE_F32 && res->data != y->data && (!norm || norm_f32) &&
        cuda_mlp_fused_fwd(ctx, norm ? NULL : (const bf16 *)x->data, norm ? &fused_norm : NULL,
                           (const bf16 *)w1->data, (const bf16 *)b1->data, (const bf16 *)w2->data,
                           (const bf16 *)b2->data, (const float *)res->data, (float *)y->data,
                           (int)s1.N, s1.K, s1.M)) {
        report_flops(ctx, &s1, 2);
        return;
    }
    if (norm) {
        xn.data = cuda_temp_alloc(ctx, xn.numel * dtype_size(xn.dtype));
        cuda_layernorm_fwd(ctx, res, NULL, norm->w, norm->b, norm->eps, NULL, &xn, NULL, NULL);
    }
    Tensor h = *x;   // (N, Hd) in x's dtype
    const int hshape[2] = {(int)s1.N, s1.M};
    tensor_set_shape(&h, 2, hshape);
    h.data = cuda_temp_alloc(ctx, h.numel * dtype_size(h.dtype));
    h.grad = NULL;
    gelu_out_fwd(ctx, x, w1, b1, kind, NULL, &h);
    res_fwd(ctx, &h, w2, b2, res, y);
    cuda_temp_free(ctx, h.data);
    if (norm) cuda_temp_free(ctx, xn.data);
}

// The shape of a GELU-fused backward, with its GELU kind and dy (N, M) in the activation dtype checked.
static LinearShape gelu_bwd_shape(const char *op, GeluKind kind, const Tensor *x, const Tensor *w,
                                  const Tensor *dy) {
    gelu_check_kind(op, kind);
    LinearShape s = linear_shape(op, x, w);
    cuda_check_matrix(op, "dy", dy, s.N, s.M);
    cuda_check_dtype(op, "dy", dy, s.act);
    return s;
}

// dpre = dy * gelu'(pre), then the linear's backward from dpre (dx_beta 1: dx added, 0: written).
static void gelu_out_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w,
                         const Tensor *pre, GeluKind kind, float dx_beta, Tensor *dx, Tensor *dw,
                         Tensor *db) {
    const char *op = "linear_bwd";
    LinearShape s = gelu_bwd_shape(op, kind, x, w, dy);
    CG_CHECK(pre != NULL, "", "op %s: gelu_out needs pre, the GELU's input", op);
    cuda_check_matrix(op, "pre", pre, s.N, s.M);
    cuda_check_dtype(op, "pre", pre, s.act);
    if (dx) {
        cuda_check_dtype(op, "dx", dx, s.act);
        CG_CHECK(tensor_same_shape(dx, x), "", "op %s: dx and x differ in shape", op);
    }
    if (dw) check_param_grad(op, "dw", dw, (size_t)s.M * s.K);
    if (db) check_param_grad(op, "db", db, (size_t)s.M);
    if (s.N == 0 || (!dx && !dw && !db)) return;

    // dpre = dy * gelu'(pre) in act dtype (what an unfused gelu_bwd would hand the linear).
    size_t n = s.N * (size_t)s.M;
    void *dpre = cuda_temp_alloc(ctx, n * dtype_size(s.act));
    CUDA_CHECK(cudaMemcpyAsync(dpre, dy->data, n * dtype_size(s.act), cudaMemcpyDeviceToDevice,
                               cuda_stream_of(ctx)));
    cuda_dgelu_scale(ctx, kind, s.act, pre->data, dpre, n);
    linear_backward(ctx, &s, dpre, x->data, w->data, dx ? dx->data : NULL,
                    dw ? (float *)dw->data : NULL, db ? (float *)db->data : NULL, dx_beta);
    cuda_temp_free(ctx, dpre);
}

// x is h = gelu(pre): dpre (linear_bwd's dx) = (dy w) * gelu'(pre) written, dpre_db += its
// column sums; dw += dy^T h; db += sum_n dy.
static void gelu_in_bwd(Ctx *ctx, const Tensor *dy, const Tensor *h, const Tensor *w,
                        const Tensor *pre, GeluKind kind, Tensor *dpre, Tensor *dpre_db, Tensor *dw,
                        Tensor *db) {
    const char *op = "linear_bwd";
    LinearShape s = gelu_bwd_shape(op, kind, h, w, dy);
    if (dw) check_param_grad(op, "dw", dw, (size_t)s.M * s.K);
    if (db) check_param_grad(op, "db", db, (size_t)s.M);
    CG_CHECK(!dpre_db || dpre, "", "op %s: gelu_in's dpre_db needs dx", op);
    if (dpre_db) check_param_grad(op, "dpre_db", dpre_db, (size_t)s.K);
    bool dpre_db_done = false;
    if (dpre) {
        CG_CHECK(pre != NULL, "", "op %s: gelu_in needs pre, the GELU's input", op);
        cuda_check_matrix(op, "pre", pre, s.N, s.K);
        cuda_check_dtype(op, "pre", pre, s.act);
        cuda_check_matrix(op, "dx", dpre, s.N, s.K);
        cuda_check_dtype(op, "dx", dpre, s.act);
    }
    if (s.N == 0) return;
    if (dpre) report_flops(ctx, &s, 1);   // the dx product (dw's: linear_backward below)
    if (dpre && kind == GELU_ERF && s.act == DTYPE_BF16 && w->dtype == DTYPE_BF16 &&
        cuda_gemm_fusion_allowed(ctx, CUDA_FUSE_DGELU) &&
        cuda_gemm_dgelu_erf_bwd(ctx, (const bf16 *)dy->data, (const bf16 *)w->data,
                                (const bf16 *)pre->data, (bf16 *)dpre->data, s.N, s.M, s.K)) {
        cuda_gemm_count_fused(ctx);   // the product and the scaling in one CUTLASS product
    } else if (dpre && kind == GELU_ERF) {   // the product written into dpre, then scaled in place
        CudaGemm g = gemm_dx(&s, dy->data, w->data, dpre->data, cuda_dtype_of(s.act), 0.0f);
        cuda_gemm(ctx, &g, "linear_bwd dx (gelu_in)");
        cuda_dgelu_scale(ctx, GELU_ERF, s.act, pre->data, dpre->data, s.N * (size_t)s.K);
    } else if (dpre) {   // dpre = (dy w) * gelu_tanh'(pre), written
        CudaGemm g = gemm_dx(&s, dy->data, w->data, dpre->data, cuda_dtype_of(s.act), 0.0f);
        g.aux = pre->data;
        g.ldaux = s.K;
        if (dpre_db) {   // and its column sums (DGELU_BGRAD overwrites: fp32 scratch, then add)
            float *tmp = (float *)cuda_gemm_scratch(ctx, (size_t)s.K * sizeof(float));
            g.epilogue = CUBLASLT_EPILOGUE_DGELU_BGRAD;
            g.bias = tmp;
            g.bias_type = CUDA_R_32F;
            if (cuda_gemm_try(ctx, &g)) {
                add_f32_kernel<<<(s.K + 255) / 256, 256, 0, cuda_stream_of(ctx)>>>(
                    (float *)dpre_db->data, tmp, s.K);
                CUDA_CHECK_LAUNCH();
                dpre_db_done = true;
            }
            g.bias = NULL;
        }
        g.epilogue = CUBLASLT_EPILOGUE_DGELU;
        if (!dpre_db_done && !cuda_gemm_try(ctx, &g)) {   // the product in fp32, then one rounding of the scaled value
            size_t n = s.N * (size_t)s.K;
            float *tmp = (float *)cuda_temp_alloc(ctx, n * sizeof(float));
            CudaGemm p = gemm_dx(&s, dy->data, w->data, tmp, CUDA_R_32F, 0.0f);
            cuda_gemm(ctx, &p, "linear_bwd dx (gelu_in)");
            cudaStream_t st = cuda_stream_of(ctx);
            if (s.act == DTYPE_BF16)
                dgelu_tanh_kernel<<<cuda_grid_for(ctx, n), 256, 0, st>>>(
                    (const float *)tmp, (const __nv_bfloat16 *)pre->data, (__nv_bfloat16 *)dpre->data, n);
            else
                dgelu_tanh_kernel<<<cuda_grid_for(ctx, n), 256, 0, st>>>(
                    (const float *)tmp, (const float *)pre->data, (float *)dpre->data, n);
            CUDA_CHECK_LAUNCH();
            cuda_temp_free(ctx, tmp);
        }
    }
    if (dpre_db && !dpre_db_done) {   // the column sums of dpre (N,K) apart
        LinearShape sp = s;
        sp.M = s.K;
        colsum_add(ctx, &sp, dpre->data, (float *)dpre_db->data);
    }
    linear_backward(ctx, &s, dy->data, h->data, w->data, NULL, dw ? (float *)dw->data : NULL,
                    db ? (float *)db->data : NULL);
}

extern "C" void cuda_linear_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b,
                                const LinearFwdOpts *opts, Tensor *y) {
    switch (linear_fwd_fusion(opts)) {
    case LINEAR_SILU_IN: silu_in_fwd(ctx, x, w, b, y); break;
    case LINEAR_GELU_OUT: gelu_out_fwd(ctx, x, w, b, opts->gelu_kind, opts->pre, y); break;
    case LINEAR_RES: res_fwd(ctx, x, w, b, opts->res, y); break;
    default: plain_fwd(ctx, x, w, b, y); break;
    }
}

// LINEAR_WRITE_DX: the dx GEMM runs with beta = 0 (no zeroing, dx never read); silu_in and
// gelu_in write dx whatever the flags say.
extern "C" void cuda_linear_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w,
                                int flags, const LinearBwdOpts *opts, Tensor *dx, Tensor *dw,
                                Tensor *db) {
    const float dx_beta = flags & LINEAR_WRITE_DX ? 0.0f : 1.0f;
    switch (linear_bwd_fusion(opts)) {
    case LINEAR_SILU_IN: silu_in_bwd(ctx, dy, x, w, dx, dw, db); break;
    case LINEAR_GELU_OUT:
        gelu_out_bwd(ctx, dy, x, w, opts->pre, opts->gelu_kind, dx_beta, dx, dw, db);
        break;
    case LINEAR_GELU_IN:
        gelu_in_bwd(ctx, dy, x, w, opts->pre, opts->gelu_kind, dx, opts->dpre_db, dw, db);
        break;
    default: linear_bwd_op("linear_bwd", ctx, dy, x, w, dx, dw, db, dx_beta); break;
    }
}
