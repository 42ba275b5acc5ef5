// `cgspn bench attention` (kernels/cuda/attention.h): forward and backward time of the attention
// op, cuDNN against the fallback kernels, bf16, at the model shapes.
//
// FLOPs, per (batch, head), N tokens, head_dim D (FlashAttention's convention: the matmuls only):
//   forward  4 N^2 D   (Q K^T and P V)
//   backward 10 N^2 D  (Q K^T again, dO V^T, P^T dO, dS^T Q, dS K)
//   so forward+backward = 14 N^2 D; TFLOP/s = those / median time.
// Times are medians of CUDA-event-timed single calls after warm-up (graph building, first-call
// setup); inputs are uniform in [-1, 1) (never zeros). The backward time includes the add that
// folds cuDNN's dq, dk, dv into dqkv (the op's += contract); its own time is shown beside it.
#include "../../kernels/cuda/attention.h"
#include "../../kernels/cuda/attention_internal.h"
#include "../../kernels/ops.h"
#include "kernel_bench.h"
#include <algorithm>
#include <stdint.h>
#include <time.h>
#include <vector>

namespace {

constexpr int WARMUP = 2;
constexpr int MAX_REPS = 20;
constexpr double TIME_PER_ROW_S = 1.0;   // fewer repetitions for slow rows (the fallback)

__global__ void fill_uniform_bf16(__nv_bfloat16 *p, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = seed ^ (i * 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        p[i] = __float2bfloat16_rn((float)(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
    }
}

Tensor gpu_tensor(DType dt, int ndim, const int *shape, uint64_t seed) {
    Tensor t{};
    tensor_set_shape(&t, ndim, shape);
    t.dtype = dt;
    t.device = DEVICE_CUDA;
    t.data = cuda_malloc(tensor_bytes(&t));
    if (dt == DTYPE_BF16) {
        fill_uniform_bf16<<<1024, 256>>>((__nv_bfloat16 *)t.data, t.numel, seed);
        CUDA_CHECK_LAUNCH();
    } else {
        CUDA_CHECK(cudaMemset(t.data, 0, tensor_bytes(&t)));
    }
    // The fill ran on the legacy stream, which the library's non-blocking stream does not wait for.
    CUDA_CHECK(cudaDeviceSynchronize());
    return t;
}

// Median time in ms of fn() over repetitions that fit TIME_PER_ROW_S.
template <typename F>
double median_ms(cudaStream_t st, F &&fn) {
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    std::vector<float> t;
    for (int i = 0; i < MAX_REPS; i++) {
        CUDA_CHECK(cudaEventRecord(a, st));
        fn();
        CUDA_CHECK(cudaEventRecord(b, st));
        CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
        if (i >= 2 && t[0] * (i + 1) > TIME_PER_ROW_S * 1e3) break;
    }
    CUDA_CHECK(cudaEventDestroy(a));
    CUDA_CHECK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

struct Config {
    const char *name;
    int B, N, H, D;
};

}   // namespace

extern "C" int cuda_bench_attention(FILE *out) {
    int ndev = cuda_device_count();
    if (ndev == 0) {
        fprintf(out, "bench attention: no CUDA device visible\n");
        return 1;
    }
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    char ver[48], date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
    fprintf(out, "attention bench: %s, %s, %s, bf16\n", prop.name, date,
            cudnn_attention_version(ver, sizeof ver));

    const Config configs[] = {{"ViT-B/16 224px", 256, 197, 12, 64},
                              {"so14 378px", 32, 729, 16, 72},
                              {"so14 1036px", 32, 5476, 16, 72}};
    struct Row {
        const char *config, *path;
        double fwd, bwd, add, flops_fwd;
    };
    std::vector<Row> rows;
    Ctx ctx = cuda_ctx_create(0, DTYPE_BF16);
    cudaStream_t st = cuda_stream_of(&ctx);
    for (const Config &cf : configs) {
        int C = cf.H * cf.D;
        int qkv_shape[3] = {cf.B, cf.N, 3 * C}, tok_shape[3] = {cf.B, cf.N, C};
        int lse_shape[3] = {cf.B, cf.H, cf.N};
        Tensor qkv = gpu_tensor(DTYPE_BF16, 3, qkv_shape, 1);
        Tensor dout = gpu_tensor(DTYPE_BF16, 3, tok_shape, 2);
        Tensor dqkv = gpu_tensor(DTYPE_BF16, 3, qkv_shape, 3);
        Tensor o = gpu_tensor(DTYPE_BF16, 3, tok_shape, 4);
        Tensor lse = gpu_tensor(DTYPE_F32, 3, lse_shape, 5);
        double flops = 4.0 * cf.B * cf.H * (double)cf.N * cf.N * cf.D;
        // the += add alone, at the size the cuDNN backward folds in
        double add_ms = median_ms(st, [&] {
            attn_accumulate(st, DTYPE_BF16, qkv.data, dqkv.data, qkv.numel);
        });
        struct Variant {
            const char *name;
            CudaAttnPath path;
            int deterministic;
        } variants[] = {{"cuDNN, deterministic asked", CUDA_ATTN_CUDNN, 1},
                        {"cuDNN, atomic dQ asked", CUDA_ATTN_CUDNN, 0},
                        {"fallback", CUDA_ATTN_FALLBACK, 1}};
        for (const Variant &v : variants) {
            ctx.deterministic = v.deterministic;
            CudaAttnPath ran_f = CUDA_ATTN_AUTO, ran_b = CUDA_ATTN_AUTO;
            int det = 1;
            auto fwd = [&] { ran_f = cuda_attention_fwd_path(&ctx, &qkv, cf.H, &o, &lse, v.path); };
            auto bwd = [&] {
                ran_b = cuda_attention_bwd_path(&ctx, &dout, &qkv, &o, &lse, cf.H, &dqkv, v.path,
                                                &det);
            };
            for (int i = 0; i < WARMUP; i++) {
                fwd();
                bwd();
            }
            CUDA_CHECK(cudaStreamSynchronize(st));
            if (v.path == CUDA_ATTN_CUDNN && (ran_f != CUDA_ATTN_CUDNN || ran_b != CUDA_ATTN_CUDNN)) {
                fprintf(out, "  %s %s: cuDNN did not run (see the line above)\n", cf.name, v.name);
                continue;
            }
            double f = median_ms(st, fwd), b = median_ms(st, bwd);
            // "*": the deterministic graph was asked for and not taken (the line above says why)
            const char *label = v.path == CUDA_ATTN_FALLBACK ? "fallback"
                                : det                            ? "cuDNN deterministic"
                                : v.deterministic                ? "cuDNN atomic dQ*"
                                                                 : "cuDNN atomic dQ";
            rows.push_back({cf.name, label, f, b, v.path == CUDA_ATTN_CUDNN ? add_ms : 0.0, flops});
        }
        Tensor *ts[] = {&qkv, &dout, &dqkv, &o, &lse};
        for (Tensor *t : ts) cuda_free(t->data);
    }
    ctx.deterministic = 1;
    cuda_ctx_destroy(&ctx);

    fprintf(out, "\n%-15s %-18s %9s %8s %9s %9s %11s %8s\n", "config", "path", "fwd ms",
            "TFLOP/s", "bwd ms", "(+= add)", "fwd+bwd ms", "TFLOP/s");
    for (const Row &r : rows)
        fprintf(out, "%-15s %-20s %9.3f %8.1f %9.3f %9.3f %11.3f %8.1f\n", r.config, r.path, r.fwd,
                r.flops_fwd / r.fwd * 1e-9, r.bwd, r.add, r.fwd + r.bwd,
                3.5 * r.flops_fwd / (r.fwd + r.bwd) * 1e-9);
    fprintf(out, "* deterministic asked, atomic dQ ran: see the backward line of that shape\n");
    return 0;
}
