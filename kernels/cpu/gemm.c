// CPU sgemm (gemm.h): BLIS-style blocking with a register-tiled micro-kernel.
//
//   for each block of MB rows of C:               (bounds the packing buffer)
//     for each depth block p0 of KC:              (sequential: fixes the summation order)
//       pack op(A) rows into MR-row panels, op(B) into NR-column panels    (all threads)
//       for each tile of C (mc rows x nt cols), in parallel:
//         for each NR-column sliver of the tile:  (KC x NR of B stays in L1)
//           for each MR-row panel of the tile:    (mc x KC of A stays in L2)
//             micro-kernel: C[MR x NR] = beta' C + alpha * A_panel B_sliver
//
// The micro-kernel is written with GCC vector types in two versions: AVX2 + FMA (compiled with
// a target attribute, chosen at run time when the CPU has both) and a baseline SSE2 one. The
// build has no -march flag, so the binary still runs on any x86-64.
#include "gemm.h"
#include "../error.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>

enum {
    GEMM_MR = 6,     // rows of C per micro-kernel call: 6 x 16 floats = 12 AVX2 accumulators
    GEMM_NR = 16,    // columns of C per micro-kernel call (two 8-wide vectors)
    GEMM_KC = 256,   // depth of a packed block: a KC x NR sliver of B is 16 KB (L1)
    GEMM_MC = 96,    // rows of C per tile: an MC x KC block of A is 96 KB (L2)
    GEMM_MB = 3072,  // rows of A packed at once: the A buffer is at most MB x KC (3 MB)
};

// Below this many flops a call runs on one thread (forking costs more than it saves).
#define GEMM_PARALLEL_MIN_FLOPS 2e5

static inline int gemm_min(int a, int b) { return a < b ? a : b; }
static inline int gemm_ceil_div(int a, int b) { return (a + b - 1) / b; }
static inline int gemm_round_up(int a, int b) { return gemm_ceil_div(a, b) * b; }

typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

// c (mr x nr, row stride ldc) = beta * c + alpha * tile, tile (MR, NR); beta == 0 does not read
// c. Inlined into each micro-kernel so it is compiled for that kernel's instruction set.
static inline __attribute__((always_inline)) void
gemm_store_tile(const float *restrict tile, float *restrict c, int ldc, int mr, int nr,
                float alpha, float beta) {
    for (int i = 0; i < mr; i++) {
        float *restrict cr = c + (size_t)i * ldc;
        const float *restrict tr = tile + i * GEMM_NR;
        if (beta == 0.0f)
            for (int j = 0; j < nr; j++) cr[j] = alpha * tr[j];
        else
            for (int j = 0; j < nr; j++) cr[j] = beta * cr[j] + alpha * tr[j];
    }
}

// The micro-kernels: c (mr x nr, row stride ldc) = beta * c + alpha * (a b) with a packed
// (kc, MR) and b packed (kc, NR) as gemm_pack_a / gemm_pack_b write them; mr <= MR, nr <= NR.
typedef void (*GemmMicroFn)(int kc, const float *restrict a, const float *restrict b,
                            float *restrict c, int ldc, int mr, int nr, float alpha, float beta);

#if defined(__x86_64__)
#define GEMM_HAVE_AVX2 1
// AVX2 + FMA: the 6 x 16 block of C lives in 12 ymm registers; per depth step two loads of B,
// six broadcasts of A and twelve FMAs. fp-contract=fast lets GCC fuse acc += a * b into FMA
// (ISO C mode turns contraction off by default).
__attribute__((target("avx2,fma"), optimize("fp-contract=fast")))
static void gemm_micro_avx2(int kc, const float *restrict a, const float *restrict b,
                            float *restrict c, int ldc, int mr, int nr, float alpha, float beta) {
    v8f acc[GEMM_MR][2];
    memset(acc, 0, sizeof acc);
    for (int p = 0; p < kc; p++) {
        v8f b0, b1;
        memcpy(&b0, b + p * GEMM_NR, sizeof b0);
        memcpy(&b1, b + p * GEMM_NR + 8, sizeof b1);
        for (int i = 0; i < GEMM_MR; i++) {
            float ai = a[p * GEMM_MR + i];
            acc[i][0] += ai * b0;
            acc[i][1] += ai * b1;
        }
    }
    if (mr == GEMM_MR && nr == GEMM_NR) {   // full tile: update C straight from registers
        for (int i = 0; i < GEMM_MR; i++)
            for (int h = 0; h < 2; h++) {
                float *cp = c + (size_t)i * ldc + 8 * h;
                v8f cv = alpha * acc[i][h];
                if (beta != 0.0f) {
                    v8f old;
                    memcpy(&old, cp, sizeof old);
                    cv += beta * old;
                }
                memcpy(cp, &cv, sizeof cv);
            }
        return;
    }
    float tile[GEMM_MR * GEMM_NR] __attribute__((aligned(32)));
    memcpy(tile, acc, sizeof tile);
    gemm_store_tile(tile, c, ldc, mr, nr, alpha, beta);
}
#endif

// Baseline (x86-64: SSE2, 16 xmm registers; other CPUs: whatever 4-wide vectors they have): the same block in two halves of 6 x 8 columns,
// 12 registers each, so nothing spills.
static void gemm_micro_baseline(int kc, const float *restrict a, const float *restrict b,
                                float *restrict c, int ldc, int mr, int nr, float alpha,
                                float beta) {
    float tile[GEMM_MR * GEMM_NR] __attribute__((aligned(16)));
    for (int half = 0; half < 2; half++) {
        v4f acc[GEMM_MR][2];
        memset(acc, 0, sizeof acc);
        for (int p = 0; p < kc; p++) {
            v4f b0, b1;
            memcpy(&b0, b + p * GEMM_NR + 8 * half, sizeof b0);
            memcpy(&b1, b + p * GEMM_NR + 8 * half + 4, sizeof b1);
            for (int i = 0; i < GEMM_MR; i++) {
                float ai = a[p * GEMM_MR + i];
                acc[i][0] += ai * b0;
                acc[i][1] += ai * b1;
            }
        }
        for (int i = 0; i < GEMM_MR; i++)
            memcpy(tile + i * GEMM_NR + 8 * half, acc[i], sizeof acc[i]);
    }
    gemm_store_tile(tile, c, ldc, mr, nr, alpha, beta);
}

// Picked once from the CPU's features (the build has no -march flag, so the binary runs on
// any x86-64); cpu_sgemm_use_baseline() lets tests run the fallback on an AVX2 machine.
static int gemm_force_baseline;

static GemmMicroFn gemm_micro_kernel(void) {
#ifdef GEMM_HAVE_AVX2
    if (!gemm_force_baseline && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return gemm_micro_avx2;
#endif
    return gemm_micro_baseline;
}

void cpu_sgemm_use_baseline(int on) { gemm_force_baseline = on; }

const char *cpu_sgemm_kernel_name(void) {
#ifdef GEMM_HAVE_AVX2
    if (gemm_micro_kernel() == gemm_micro_avx2) return "avx2+fma 6x16";
#endif
    return "baseline 6x16";
}

// Panel of op(A): rows row0..row0+rows-1 (rows <= MR), depth p0..p0+kc-1 -> dst[p*MR + i];
// rows past `rows` are zero so the micro-kernel always runs full width.
static void gemm_pack_a(int transa, const float *A, int lda, int row0, int rows, int p0, int kc,
                        float *dst) {
    if (!transa) {   // op(A)[i][p] = A[i*lda + p]: read each row contiguously
        for (int i = 0; i < rows; i++) {
            const float *src = A + (size_t)(row0 + i) * lda + p0;
            for (int p = 0; p < kc; p++) dst[p * GEMM_MR + i] = src[p];
        }
    } else {         // op(A)[i][p] = A[p*lda + i]: MR contiguous floats per depth step
        for (int p = 0; p < kc; p++) {
            const float *src = A + (size_t)(p0 + p) * lda + row0;
            for (int i = 0; i < rows; i++) dst[p * GEMM_MR + i] = src[i];
        }
    }
    for (int p = 0; p < kc; p++)
        for (int i = rows; i < GEMM_MR; i++) dst[p * GEMM_MR + i] = 0.0f;
}

// Sliver of op(B): columns col0..col0+cols-1 (cols <= NR), depth p0..p0+kc-1 -> dst[p*NR + j].
static void gemm_pack_b(int transb, const float *B, int ldb, int col0, int cols, int p0, int kc,
                        float *dst) {
    if (!transb) {   // op(B)[p][j] = B[p*ldb + j]
        for (int p = 0; p < kc; p++) {
            const float *src = B + (size_t)(p0 + p) * ldb + col0;
            for (int j = 0; j < cols; j++) dst[p * GEMM_NR + j] = src[j];
            for (int j = cols; j < GEMM_NR; j++) dst[p * GEMM_NR + j] = 0.0f;
        }
    } else {         // op(B)[p][j] = B[j*ldb + p]
        for (int j = 0; j < cols; j++) {
            const float *src = B + (size_t)(col0 + j) * ldb + p0;
            for (int p = 0; p < kc; p++) dst[p * GEMM_NR + j] = src[p];
        }
        for (int p = 0; p < kc; p++)
            for (int j = cols; j < GEMM_NR; j++) dst[p * GEMM_NR + j] = 0.0f;
    }
}

// Packing buffer of the calling thread, 64-byte aligned, grown on demand and reused by later
// calls (a fresh allocation per call would page-fault a few MB every linear layer).
static _Thread_local float *gemm_buf;
static _Thread_local size_t gemm_buf_floats;

static float *gemm_scratch(size_t floats) {
    if (floats > gemm_buf_floats) {
        free(gemm_buf);
        size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
        gemm_buf = aligned_alloc(64, bytes);
        CG_CHECK(gemm_buf != NULL, "reduce batch_size or model size",
                 "sgemm: out of host memory allocating a %zu-byte packing buffer", bytes);
        gemm_buf_floats = floats;
    }
    return gemm_buf;
}

// C = beta * C (the K == 0 / alpha == 0 case).
static void gemm_scale(int M, int N, float beta, float *C, int ldc) {
    for (int i = 0; i < M; i++) {
        float *row = C + (size_t)i * ldc;
        if (beta == 0.0f) memset(row, 0, (size_t)N * sizeof(float));
        else for (int j = 0; j < N; j++) row[j] *= beta;
    }
}

void cpu_sgemm(int transa, int transb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    CG_CHECK(M >= 0 && N >= 0 && K >= 0, "", "sgemm: negative size M=%d N=%d K=%d", M, N, K);
    CG_CHECK(lda >= (transa ? M : K) && ldb >= (transb ? K : N) && ldc >= N, "",
             "sgemm: leading dimensions lda=%d ldb=%d ldc=%d too small for M=%d N=%d K=%d "
             "(transa=%d transb=%d)", lda, ldb, ldc, M, N, K, transa, transb);
    if (M == 0 || N == 0) return;
    if (K == 0 || alpha == 0.0f) {
        gemm_scale(M, N, beta, C, ldc);
        return;
    }

    int kc_max = gemm_min(K, GEMM_KC);
    int mb_max = gemm_min(M, GEMM_MB);
    int b_panels = gemm_ceil_div(N, GEMM_NR);
    size_t a_floats = (size_t)gemm_round_up(mb_max, GEMM_MR) * kc_max;
    a_floats = (a_floats + 15) / 16 * 16;   // keeps the B panels 64-byte aligned
    size_t b_floats = (size_t)b_panels * GEMM_NR * kc_max;
    float *Ap = gemm_scratch(a_floats + b_floats);
    float *Bp = Ap + a_floats;

    GemmMicroFn micro = gemm_micro_kernel();
    int nthreads = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (2.0 * M * N * K < GEMM_PARALLEL_MIN_FLOPS) nthreads = 1;

    for (int i0 = 0; i0 < M; i0 += GEMM_MB) {
        int mb = gemm_min(GEMM_MB, M - i0);
        int a_panels = gemm_ceil_div(mb, GEMM_MR);
        // Tiles of C handed to threads: shrink them until there are a few per thread. Tiling
        // changes only who computes an element, never the order of its sum.
        int mc = GEMM_MC, nt = gemm_round_up(N, GEMM_NR);
        while (gemm_ceil_div(mb, mc) * gemm_ceil_div(N, nt) < 4 * nthreads && nt > GEMM_NR)
            nt = gemm_round_up(nt / 2, GEMM_NR);
        while (gemm_ceil_div(mb, mc) * gemm_ceil_div(N, nt) < 4 * nthreads && mc > GEMM_MR)
            mc = gemm_round_up(mc / 2, GEMM_MR);
        int tiles_m = gemm_ceil_div(mb, mc), tiles_n = gemm_ceil_div(N, nt);
        float *Cb = C + (size_t)i0 * ldc;
        const float *Ab = transa ? A + i0 : A + (size_t)i0 * lda;

        #pragma omp parallel num_threads(nthreads) if (nthreads > 1)
        for (int p0 = 0; p0 < K; p0 += GEMM_KC) {   // every thread walks the depth blocks
            int kc = gemm_min(GEMM_KC, K - p0);
            float beta_p = p0 == 0 ? beta : 1.0f;   // later depth blocks add to C
            #pragma omp for schedule(static) nowait
            for (int r = 0; r < a_panels; r++)
                gemm_pack_a(transa, Ab, lda, r * GEMM_MR, gemm_min(GEMM_MR, mb - r * GEMM_MR), p0,
                            kc, Ap + (size_t)r * GEMM_MR * kc);
            #pragma omp for schedule(static)
            for (int s = 0; s < b_panels; s++)
                gemm_pack_b(transb, B, ldb, s * GEMM_NR, gemm_min(GEMM_NR, N - s * GEMM_NR), p0,
                            kc, Bp + (size_t)s * GEMM_NR * kc);
            // (the barrier above: all panels packed before any tile reads them)
            #pragma omp for schedule(dynamic, 1)
            for (int t = 0; t < tiles_m * tiles_n; t++) {
                int r0 = (t / tiles_n) * mc, r1 = gemm_min(mb, r0 + mc);
                int c0 = (t % tiles_n) * nt, c1 = gemm_min(N, c0 + nt);
                for (int j = c0; j < c1; j += GEMM_NR)
                    for (int i = r0; i < r1; i += GEMM_MR)
                        micro(kc, Ap + (size_t)(i / GEMM_MR) * GEMM_MR * kc,
                                   Bp + (size_t)(j / GEMM_NR) * GEMM_NR * kc,
                                   Cb + (size_t)i * ldc + j, ldc, gemm_min(GEMM_MR, r1 - i),
                                   gemm_min(GEMM_NR, c1 - j), alpha, beta_p);
            }
            // (the barrier above: all tiles done before the next depth block repacks)
        }
    }
}
