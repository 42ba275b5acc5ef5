// `cgspn bench gemm` (bench/cuda/kernel_bench.h): the bf16 linear products of a training step,
// timed through the CUDA ops themselves (plan lookup and epilogue handling included), for the
// ViT-B/16 layers at batch 256 x 197 tokens, the so14 MLP at 1036 px (B=32, 74x74 tokens) and
// gspn_t's linears at batch 128 (in_proj, fc1, fc2 of each stage: 56^2 .. 7^2 positions, widths
// 96 .. 768). FLOPs are 2 N K M per product; the percent is of the ~770 TFLOP/s dense bf16 peak
// measured on the H100. The roofline of a product is the longer of its FLOPs at that peak and its
// bf16 operands moved once at the copy bandwidth measured in the same run (the narrow stages of
// gspn_t are memory-bound): "roof" is that time over the measured one. The GELU rows time the tanh
// form through cuBLASLt's epilogues (fused and unfused) and the erf form through the CUTLASS
// kernels that gspn_t/s/b run (kernels/cuda/gemm_cutlass.cu; the unfused path without them).
#include "../../kernels/cuda/cuda_gemm.h"
#include "kernel_bench.h"
#include "../../kernels/ops.h"
#include <time.h>

// Each timing repeats the product for about this long (after two warm-up calls).
#define BENCH_TARGET_MS 150.0

typedef struct BenchLinear {
    const char *name;
    int N, K, M;
    int gelu;   // 1: fc1 (its output goes through GELU); 2: fc2 (its input is a GELU output)
} BenchLinear;

static const BenchLinear BENCH_SHAPES[] = {
    {"vit_b16 qkv", 256 * 197, 768, 2304, 0},
    {"vit_b16 proj", 256 * 197, 768, 768, 0},
    {"vit_b16 fc1", 256 * 197, 768, 3072, 1},
    {"vit_b16 fc2", 256 * 197, 3072, 768, 2},
    {"so14 fc1 (B=32, 74x74)", 32 * 74 * 74, 1152, 4304, 1},
    {"so14 fc2 (B=32, 74x74)", 32 * 74 * 74, 4304, 1152, 2},
    {"gspn_t 56^2 in_proj", 128 * 3136, 96, 144, 0},
    {"gspn_t 56^2 fc1", 128 * 3136, 96, 384, 1},
    {"gspn_t 56^2 fc2", 128 * 3136, 384, 96, 2},
    {"gspn_t 28^2 in_proj", 128 * 784, 192, 288, 0},
    {"gspn_t 28^2 fc1", 128 * 784, 192, 768, 1},
    {"gspn_t 28^2 fc2", 128 * 784, 768, 192, 2},
    {"gspn_t 14^2 in_proj", 128 * 196, 384, 576, 0},
    {"gspn_t 14^2 fc1", 128 * 196, 384, 1536, 1},
    {"gspn_t 14^2 fc2", 128 * 196, 1536, 384, 2},
    {"gspn_t 7^2 in_proj", 128 * 49, 768, 1152, 0},
    {"gspn_t 7^2 fc1", 128 * 49, 768, 3072, 1},
    {"gspn_t 7^2 fc2", 128 * 49, 3072, 768, 2},
};

static double g_copy_gbs;   // the device copy bandwidth, measured at the start of the run

// Uniform in [-1, 1) from a hash of the index (no host copies of the big operands).
template <typename T>
__global__ void bench_fill_kernel(T *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
        p[i] = cuda_from_f32<T>((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
    }
}

static Tensor bench_tensor(Ctx *ctx, int rows, int cols, DType dt, uint32_t seed) {
    Tensor t;
    memset(&t, 0, sizeof t);
    int shape[2] = {rows, cols};
    tensor_set_shape(&t, rows > 0 ? 2 : 1, rows > 0 ? shape : shape + 1);
    t.dtype = dt;
    t.device = DEVICE_CUDA;
    t.data = cuda_malloc(tensor_bytes(&t));
    cudaStream_t st = cuda_stream_of(ctx);
    if (dt == DTYPE_BF16)
        bench_fill_kernel<<<cuda_grid_for(ctx, t.numel), 256, 0, st>>>((__nv_bfloat16 *)t.data, t.numel, seed);
    else
        bench_fill_kernel<<<cuda_grid_for(ctx, t.numel), 256, 0, st>>>((float *)t.data, t.numel, seed);
    CUDA_CHECK_LAUNCH();
    return t;
}

// Milliseconds per call of f on the context's stream.
template <typename F>
static double bench_ms(Ctx *ctx, F f) {
    cudaStream_t st = cuda_stream_of(ctx);
    cudaEvent_t t0, t1;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    f();
    f();
    CUDA_CHECK(cudaEventRecord(t0, st));
    f();
    CUDA_CHECK(cudaEventRecord(t1, st));
    CUDA_CHECK(cudaEventSynchronize(t1));
    float once = 0;
    CUDA_CHECK(cudaEventElapsedTime(&once, t0, t1));
    int reps = once > 0 ? (int)(BENCH_TARGET_MS / once) : 100;
    reps = reps < 3 ? 3 : reps > 1000 ? 1000 : reps;
    CUDA_CHECK(cudaEventRecord(t0, st));
    for (int i = 0; i < reps; i++) f();
    CUDA_CHECK(cudaEventRecord(t1, st));
    CUDA_CHECK(cudaEventSynchronize(t1));
    float total = 0;
    CUDA_CHECK(cudaEventElapsedTime(&total, t0, t1));
    CUDA_CHECK(cudaEventDestroy(t0));
    CUDA_CHECK(cudaEventDestroy(t1));
    return total / reps;
}

static void bench_row(FILE *out, const BenchLinear *s, const char *product, double ms) {
    const double flops = 2.0 * s->N * (double)s->K * s->M, tflops = flops / (ms * 1e-3) / 1e12;
    // bf16 x (N,K), w (M,K) and y (N,M) once (or their gradients: the same sizes)
    const double bytes = 2.0 * ((double)s->N * s->K + (double)s->M * s->K + (double)s->N * s->M);
    const double roof_ms = fmax(flops / (BENCH_BF16_PEAK_TFLOPS * 1e12), bytes / (g_copy_gbs * 1e9)) * 1e3;
    fprintf(out, "%-24s %-30s %7d %5d %5d %9.3f %8.1f %6.1f%% %6.1f%%\n", s->name, product, s->N,
            s->K, s->M, ms, tflops, 100.0 * tflops / BENCH_BF16_PEAK_TFLOPS, 100.0 * roof_ms / ms);
    fflush(out);
}

extern "C" int cuda_bench_gemm(FILE *out) {
    if (cuda_device_count() == 0) {
        fprintf(out, "bench gemm: no CUDA device visible\n");
        return 1;
    }
    Ctx ctx = cuda_ctx_create(0, DTYPE_BF16);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
    g_copy_gbs = cuda_bench_copy_gbs();
    fprintf(out, "bench gemm: %s, %s, bf16 in / fp32 accumulate, peak %.0f TFLOP/s (measured H100), "
            "copy %.0f GB/s\n", prop.name, date, BENCH_BF16_PEAK_TFLOPS, g_copy_gbs);
    fprintf(out, "%-24s %-30s %7s %5s %5s %9s %8s %7s %7s\n", "layer", "product", "N", "K", "M", "ms",
            "TFLOP/s", "peak", "roof");

    for (size_t i = 0; i < sizeof BENCH_SHAPES / sizeof BENCH_SHAPES[0]; i++) {
        const BenchLinear *s = &BENCH_SHAPES[i];
        Tensor x = bench_tensor(&ctx, s->N, s->K, DTYPE_BF16, 1);
        Tensor w = bench_tensor(&ctx, s->M, s->K, DTYPE_BF16, 2);
        Tensor b = bench_tensor(&ctx, 0, s->M, DTYPE_BF16, 3);
        Tensor y = bench_tensor(&ctx, s->N, s->M, DTYPE_BF16, 4);
        Tensor dy = bench_tensor(&ctx, s->N, s->M, DTYPE_BF16, 5);
        Tensor dx = bench_tensor(&ctx, s->N, s->K, DTYPE_BF16, 6);
        Tensor dw = bench_tensor(&ctx, s->M, s->K, DTYPE_F32, 7);
        Tensor db = bench_tensor(&ctx, 0, s->M, DTYPE_F32, 8);
        Ctx *c = &ctx;

        bench_row(out, s, "fwd y = x w^T + b (BIAS)", bench_ms(c, [&] { cuda_linear_fwd(c, &x, &w, &b, NULL, &y); }));
        if (s->gelu == 1) {
            Tensor pre = bench_tensor(&ctx, s->N, s->M, DTYPE_BF16, 9);
            LinearFwdOpts tanh_out = {}, erf_out = {};
            tanh_out.gelu_out = erf_out.gelu_out = 1;
            tanh_out.gelu_kind = GELU_TANH;
            erf_out.gelu_kind = GELU_ERF;
            tanh_out.pre = erf_out.pre = &pre;
            bench_row(out, s, "fwd + gelu (GELU_AUX_BIAS)",
                      bench_ms(c, [&] { cuda_linear_fwd(c, &x, &w, &b, &tanh_out, &y); }));
            cuda_gemm_set_fusion(c, 0);
            bench_row(out, s, "fwd + gelu unfused",
                      bench_ms(c, [&] { cuda_linear_fwd(c, &x, &w, &b, &tanh_out, &y); }));
            cuda_gemm_set_fusion(c, CUDA_FUSE_DEFAULT);
            bench_row(out, s, "fwd + gelu erf (CUTLASS)",
                      bench_ms(c, [&] { cuda_linear_fwd(c, &x, &w, &b, &erf_out, &y); }));
            cuda_free(pre.data);
        }
        bench_row(out, s, "bwd dx += dy w", bench_ms(c, [&] { cuda_linear_bwd(c, &dy, &x, &w, 0, NULL, &dx, NULL, NULL); }));
        if (s->gelu == 2) {   // x stands in for h = gelu(pre) and for pre; dx receives dpre
            LinearBwdOpts tanh_in = {}, erf_in = {};
            tanh_in.gelu_in = erf_in.gelu_in = 1;
            tanh_in.gelu_kind = GELU_TANH;
            erf_in.gelu_kind = GELU_ERF;
            tanh_in.pre = erf_in.pre = &x;
            bench_row(out, s, "bwd dpre erf (CUTLASS)",
                      bench_ms(c, [&] { cuda_linear_bwd(c, &dy, &x, &w, 0, &erf_in, &dx, NULL, NULL); }));
            bench_row(out, s, "bwd dpre = dy w * gelu' (DGELU)",
                      bench_ms(c, [&] { cuda_linear_bwd(c, &dy, &x, &w, 0, &tanh_in, &dx, NULL, NULL); }));
            cuda_gemm_set_fusion(c, 0);
            bench_row(out, s, "bwd dpre unfused",
                      bench_ms(c, [&] { cuda_linear_bwd(c, &dy, &x, &w, 0, &tanh_in, &dx, NULL, NULL); }));
            cuda_gemm_set_fusion(c, CUDA_FUSE_DEFAULT);
        }
        bench_row(out, s, "bwd dw += dy^T x", bench_ms(c, [&] { cuda_linear_bwd(c, &dy, &x, &w, 0, NULL, NULL, &dw, NULL); }));
        bench_row(out, s, "bwd dw, db (default)",
                  bench_ms(c, [&] { cuda_linear_bwd(c, &dy, &x, &w, 0, NULL, NULL, &dw, &db); }));
        cuda_gemm_set_fusion(c, CUDA_FUSE_DEFAULT & ~CUDA_FUSE_BIAS_GRAD_TALL);
        bench_row(out, s, "bwd dw, db (colsum)",
                  bench_ms(c, [&] { cuda_linear_bwd(c, &dy, &x, &w, 0, NULL, NULL, &dw, &db); }));
        cuda_gemm_set_fusion(c, CUDA_FUSE_ALL);
        bench_row(out, s, "bwd dw, db (BGRAD* + add)",
                  bench_ms(c, [&] { cuda_linear_bwd(c, &dy, &x, &w, 0, NULL, NULL, &dw, &db); }));
        cuda_gemm_set_fusion(c, CUDA_FUSE_DEFAULT);

        Tensor *all[] = {&x, &w, &b, &y, &dy, &dx, &dw, &db};
        for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) cuda_free(all[k]->data);
    }
    int plans;
    long queries, fused;
    cuda_gemm_cache_stats(&ctx, &plans, &queries, &fused);
    fprintf(out, "plans cached: %d, heuristic queries: %ld, fused-epilogue launches: %ld\n", plans,
            queries, fused);
    cuda_ctx_destroy(&ctx);
    return 0;
}
