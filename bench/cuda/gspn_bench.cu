// `cgspn bench gspn` (bench/cuda/kernel_bench.h): the C-GSPN scan's forward and backward time
// against the device-to-device copy bandwidth measured in the same run.
//
// Byte model, per token (B*H*W tokens), e = bytes per activation element, G gates per token
// (20*Cc per-channel, 4*(2*Cc+3) shared), hidden fp32 for the four directions (the training path
// saves it):
//   forward  must move: read xc (Cc e) + gates (G e), write yc (Cc e) + hidden (16 Cc)
//   backward must move: read dyc (Cc e) + xc (Cc e) + gates (G e) + hidden (16 Cc),
//                       write dxc (Cc e) + dgates (G e)
//   backward with +=  : the above + read dxc (Cc e) + dgates (G e): gspn_scan_bwd accumulates,
//                       so a kernel that honours that contract must read them too
// "bwd" times gspn_scan_bwd with GSPN_SCAN_WRITE_GRADS (what the tape runs: the gradients are
// written, kernels/ops_list.h) against the must-move bytes; "bwd +=" times the accumulating
// gspn_scan_bwd (libcgspn's ABI) against the += bytes.
// GB/s = those bytes / median time; "%copy" = that / the copy bandwidth (bytes read + written by
// cudaMemcpy device-to-device of 1 GiB). "moved" columns use the bytes this implementation
// really moves (the header of gspn_scan.cu derives them), to show how close the kernels run to
// the copy rate on their own traffic. For shared weights that formula is a lower bound: each
// direction fetches whole 64-byte DRAM atoms for its 38-byte gate chunk (gspn_scan_notes.md).
#include "../../kernels/cuda/cuda_common.h"
#include "kernel_bench.h"
#include "../../kernels/ops.h"
#include <algorithm>
#include <stdint.h>
#include <time.h>
#include <vector>

// kernels/cuda/gspn_scan.cu, with the tuning the default entry points fix (0, 0, 0, 0, 15): auto.
extern "C" void cuda_gspn_scan_fwd_tuned(Ctx *ctx, const Tensor *xc, const Tensor *gates,
                                         const Tensor *merge, int shared_w, Tensor *yc,
                                         Tensor *hidden, int cg_bytes, int vec_bytes,
                                         int stages, int prefetch, int dir_mask);
extern "C" void cuda_gspn_scan_bwd_tuned(Ctx *ctx, const Tensor *dyc, const Tensor *xc,
                                         const Tensor *gates, const Tensor *merge, int shared_w,
                                         const Tensor *hidden, Tensor *dxc, Tensor *dgates,
                                         Tensor *dmerge, int cg_bytes, int vec_bytes,
                                         int stages, int prefetch, int dir_mask, int write);

namespace {

constexpr int WARMUP = 3;

constexpr int REPS = 25;   // median of these

__device__ __forceinline__ uint64_t splitmix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

template <typename T>
__global__ void fill_uniform_kernel(T *p, size_t n, uint64_t seed, float lo, float hi) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float r = (float)(splitmix(seed ^ (i * 0x2545F4914F6CDD1Dull)) >> 40) * (1.0f / 16777216.0f);
        const float v = lo + (hi - lo) * r;
        if constexpr (sizeof(T) == 2) p[i] = __float2bfloat16_rn(v);
        else p[i] = v;
    }
}

Tensor gpu_tensor(DType dt, int ndim, const int *shape) {
    Tensor t{};
    tensor_set_shape(&t, ndim, shape);
    t.dtype = dt;
    t.device = DEVICE_CUDA;
    t.data = cuda_malloc(tensor_bytes(&t));
    return t;
}

void fill(Ctx *ctx, Tensor *t, uint64_t seed, float lo, float hi) {
    cudaStream_t st = cuda_stream_of(ctx);
    if (t->dtype == DTYPE_BF16)
        fill_uniform_kernel<<<1024, 256, 0, st>>>((__nv_bfloat16 *)t->data, t->numel, seed, lo, hi);
    else
        fill_uniform_kernel<<<1024, 256, 0, st>>>((float *)t->data, t->numel, seed, lo, hi);
    CUDA_CHECK_LAUNCH();
}

float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Median milliseconds of fn() over REPS runs after WARMUP, CUDA events on the main stream.
template <typename F>
float time_ms(Ctx *ctx, F fn, int reps = REPS) {
    if (reps == 0) {   // one run, untimed (under a profiler)
        fn();
        CUDA_CHECK(cudaStreamSynchronize(cuda_stream_of(ctx)));
        return 0.0f;
    }
    cudaStream_t st = cuda_stream_of(ctx);
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < WARMUP; i++) fn();
    std::vector<float> ms;
    for (int i = 0; i < reps; i++) {
        CUDA_CHECK(cudaEventRecord(a, st));
        fn();
        CUDA_CHECK(cudaEventRecord(b, st));
        CUDA_CHECK(cudaEventSynchronize(b));
        float t = 0;
        CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    CUDA_CHECK(cudaEventDestroy(a));
    CUDA_CHECK(cudaEventDestroy(b));
    return median(ms);
}

// Device-to-device copy of 1 GiB; GB/s counting bytes read plus bytes written.
double copy_gbs(Ctx *ctx) {
    const size_t bytes = (size_t)1 << 30;
    void *src = cuda_malloc(bytes), *dst = cuda_malloc(bytes);
    CUDA_CHECK(cudaMemsetAsync(src, 1, bytes, cuda_stream_of(ctx)));
    const float ms = time_ms(ctx, [&] {
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_stream_of(ctx)));
    });
    cuda_free(src);
    cuda_free(dst);
    return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

struct Config {
    int B, H, W, Cc, shared;
    DType dt;
};

struct Result {
    float fwd_ms, bwd_ms, bwd_acc_ms;   // bwd: the writing op; bwd_acc: the accumulating one
    double fwd_must, bwd_must, bwd_acc, fwd_moved, bwd_moved;   // bytes
};

struct Tune {
    int cg, vec, stages, prefetch, dirs;   // Tuning (gspn_scan_common.cuh)
};
const Tune DEFAULT_TUNE = {0, 0, 0, 0, 15};   // auto channel group and vectors

Result run_config(Ctx *ctx, const Config &cf, const Tune &tu, int reps = REPS) {
    const int G = cf.shared ? 4 * (2 * cf.Cc + 3) : 20 * cf.Cc;
    const int sx[4] = {cf.B, cf.H, cf.W, cf.Cc}, sg[4] = {cf.B, cf.H, cf.W, G};
    const int sh[5] = {4, cf.B, cf.H, cf.W, cf.Cc}, sm[1] = {4};
    Tensor xc = gpu_tensor(cf.dt, 4, sx), gates = gpu_tensor(cf.dt, 4, sg);
    Tensor yc = gpu_tensor(cf.dt, 4, sx), dyc = gpu_tensor(cf.dt, 4, sx);
    Tensor dxc = gpu_tensor(cf.dt, 4, sx), dgates = gpu_tensor(cf.dt, 4, sg);
    Tensor hidden = gpu_tensor(DTYPE_F32, 5, sh);
    Tensor merge = gpu_tensor(DTYPE_F32, 1, sm), dmerge = gpu_tensor(DTYPE_F32, 1, sm);
    fill(ctx, &xc, 1, -1.0f, 1.0f);
    fill(ctx, &gates, 2, -1.0f, 1.0f);
    fill(ctx, &dyc, 3, -1.0f, 1.0f);
    fill(ctx, &dxc, 4, -1.0f, 1.0f);
    fill(ctx, &dgates, 5, -1.0f, 1.0f);
    fill(ctx, &merge, 6, 0.1f, 0.4f);
    fill(ctx, &dmerge, 7, -1.0f, 1.0f);

    Result r{};
    r.fwd_ms = time_ms(ctx, [&] {
        cuda_gspn_scan_fwd_tuned(ctx, &xc, &gates, &merge, cf.shared, &yc, &hidden, tu.cg, tu.vec,
                                 tu.stages, tu.prefetch, tu.dirs);
    }, reps);
    for (int write = 1; write >= 0; write--) {
        const float ms = time_ms(ctx, [&] {
            cuda_gspn_scan_bwd_tuned(ctx, &dyc, &xc, &gates, &merge, cf.shared, &hidden, &dxc,
                                     &dgates, &dmerge, tu.cg, tu.vec, tu.stages, tu.prefetch,
                                     tu.dirs, write);
        }, reps);
        (write ? r.bwd_ms : r.bwd_acc_ms) = ms;
    }
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream_of(ctx)));

    const double tok = (double)cf.B * cf.H * cf.W, e = cf.dt == DTYPE_BF16 ? 2 : 4;
    const double x = tok * cf.Cc * e, g = tok * G * e, h = tok * cf.Cc * 16.0;
    r.fwd_must = x + g + x + h;
    r.bwd_must = x + x + g + h + x + g;
    r.bwd_acc = r.bwd_must + x + g;
    const double part = tok * cf.Cc * 4.0;   // one direction's y_d or lam_d dh_d slice, fp32
    r.fwd_moved = 4 * x + g + h + 8 * part + x;
    r.bwd_moved = 4 * x + 4 * x + g + h + g + 8 * part + x;   // written: no dgates / dxc read back

    Tensor *all[] = {&xc, &gates, &yc, &dyc, &dxc, &dgates, &hidden, &merge, &dmerge};
    for (Tensor *t : all) cuda_free(t->data);
    return r;
}

void print_row(FILE *out, const Config &cf, const Tune &tu, const Result &r, double copy) {
    const double fg = r.fwd_must / (r.fwd_ms * 1e-3) / 1e9, bg = r.bwd_must / (r.bwd_ms * 1e-3) / 1e9;
    const double ba = r.bwd_acc / (r.bwd_acc_ms * 1e-3) / 1e9;
    const double fm = r.fwd_moved / (r.fwd_ms * 1e-3) / 1e9, bm = r.bwd_moved / (r.bwd_ms * 1e-3) / 1e9;
    char cfg[96];
    snprintf(cfg, sizeof cfg, "B=%d %dx%d Cc=%d %s %s cg=%d v=%d D=%d P=%d%s", cf.B, cf.H, cf.W,
             cf.Cc, cf.dt == DTYPE_BF16 ? "bf16" : "fp32", cf.shared ? "shared" : "chan", tu.cg,
             tu.vec, tu.stages, tu.prefetch,
             tu.dirs == 3 ? " TB+BT" : tu.dirs == 12 ? " LR+RL" : tu.dirs == 15 ? "" : " dirs?");
    fprintf(out,
            "%-44s | fwd %8.3f ms %7.1f MB %6.0f GB/s %5.1f%% (moved %5.1f%%) | bwd %8.3f ms "
            "%7.1f MB %6.0f GB/s %5.1f%% (moved %5.1f%%) | bwd += %8.3f ms %5.1f%%\n",
            cfg, r.fwd_ms, r.fwd_must / 1e6, fg, 100 * fg / copy, 100 * fm / copy, r.bwd_ms,
            r.bwd_must / 1e6, bg, 100 * bg / copy, 100 * bm / copy, r.bwd_acc_ms, 100 * ba / copy);
    fflush(out);
}

}  // namespace

extern "C" int cuda_bench_gspn(FILE *out) {
    if (cuda_device_count() == 0) {
        fprintf(out, "cgspn bench gspn: no CUDA device visible\n");
        return 1;
    }
    Ctx ctx = cuda_ctx_create(0, DTYPE_BF16);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    char date[64];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    const double copy = copy_gbs(&ctx);
    fprintf(out, "gspn scan benchmark: %s (%d SMs, %.0f MB L2), %s\n", prop.name,
            prop.multiProcessorCount, prop.l2CacheSize / 1e6, date);
    fprintf(out, "device-to-device copy: %.0f GB/s (read + write); times: median of %d after %d "
                 "warm-up; bytes: what must move (gspn_bench.cu)\n", copy, REPS, WARMUP);

    const Config main_cfgs[] = {
        {32, 27, 27, 64, 0, DTYPE_BF16},  {32, 37, 37, 64, 0, DTYPE_BF16},
        {32, 54, 54, 64, 0, DTYPE_BF16},  {32, 74, 74, 64, 0, DTYPE_BF16},
        {32, 147, 147, 64, 0, DTYPE_BF16}, {16, 1024, 1024, 8, 1, DTYPE_BF16},
    };
    for (const Config &cf : main_cfgs) print_row(out, cf, DEFAULT_TUNE, run_config(&ctx, cf, DEFAULT_TUNE), copy);

    // Tuning variants: cg = bytes of a token's channels one block owns (16 = half a sector,
    // 32 = one sector, the default, 64 = two); v = bytes a thread loads at once; D = stages of
    // the cp.async pipeline (0 = chosen by occupancy, 1 = the simple, unpipelined kernels);
    // P = L2 prefetch distance in steps (0 = none).
    fprintf(out, "tuning variants (cg bytes per block and token, v bytes per load, D stages, "
                 "P prefetch steps):\n");
    const Config var_cfgs[] = {{32, 74, 74, 64, 0, DTYPE_BF16}, {32, 147, 147, 64, 0, DTYPE_BF16}};
    // (dirs = 3 or 12 runs only TB+BT or LR+RL of the pipelined kernels: a diagnostic for
    // cuda_bench_gspn_config; the bytes columns then still count all four directions.)
    const Tune variants[] = {{64, 8, 0, 0, 15}, {32, 8, 0, 0, 15}, {32, 16, 0, 0, 15},
                             {64, 8, 0, 1, 15}, {32, 16, 1, 0, 15}, {64, 8, 2, 0, 15}};
    for (const Config &cf : var_cfgs)
        for (const auto &v : variants)
            print_row(out, cf, v, run_config(&ctx, cf, v), copy);
    // The configurations the defaults had before the forward took 128-byte groups and the depth
    // rule kept shared memory under 160 KB per SM: 64-byte groups at D = 4 (27^2 to 54^2 forward;
    // 27^2 and 54^2 backward too); and 147^2 forward with two items a thread at D = 3 (207 KB),
    // against the default's D = 2 (gspn_scan_notes.md).
    const struct { Config cf; Tune tu; } extra[] = {
        {{32, 27, 27, 64, 0, DTYPE_BF16}, {64, 8, 4, 0, 15}},
        {{32, 37, 37, 64, 0, DTYPE_BF16}, {64, 8, 4, 0, 15}},
        {{32, 54, 54, 64, 0, DTYPE_BF16}, {64, 8, 4, 0, 15}},
        {{32, 147, 147, 64, 0, DTYPE_BF16}, {64, 8, 3, 0, 15}},
    };
    for (const auto &x : extra) print_row(out, x.cf, x.tu, run_config(&ctx, x.cf, x.tu), copy);
    // Shared weights: D = 1 runs the simple kernels (element-wise gate loads) the staged ones
    // replaced.
    const Config sh_cfg = {16, 1024, 1024, 8, 1, DTYPE_BF16};
    const Tune sh_simple = {0, 0, 1, 0, 15};
    print_row(out, sh_cfg, sh_simple, run_config(&ctx, sh_cfg, sh_simple), copy);

    // Compact channels (the fast GSPN classifiers): shared weights and a proxy of Cc = 2 at the four stage grids
    // of a hierarchical GSPN-T at 224 px and batch 128 (56^2, 28^2, 14^2, 7^2), then Cc = 1, 4
    // and 8 at 56^2.
    fprintf(out, "compact channels, shared weights (the hierarchical models' stages at 224 px):\n");
    const Config compact[] = {
        {128, 56, 56, 2, 1, DTYPE_BF16}, {128, 28, 28, 2, 1, DTYPE_BF16},
        {128, 14, 14, 2, 1, DTYPE_BF16}, {128, 7, 7, 2, 1, DTYPE_BF16},
        {128, 56, 56, 1, 1, DTYPE_BF16}, {128, 56, 56, 4, 1, DTYPE_BF16},
        {128, 56, 56, 8, 1, DTYPE_BF16},
    };
    for (const Config &cf : compact) print_row(out, cf, DEFAULT_TUNE, run_config(&ctx, cf, DEFAULT_TUNE), copy);

    // The C-GSPN paper's kernel timings (an A100): its Fig. 3 (1024^2, batch 16, 8 channels) and
    // Fig. S3 (1024^2, batch 256, 1 channel), forward, beside ours. Ours also writes the hidden
    // states the training path saves (the "must move" bytes above count them).
    fprintf(out, "the paper's cases (compact channels, shared weights), forward:\n");
    const struct { const char *what; Config cf; double paper_ms; } paper[] = {
        {"Fig. 3: 1024^2, B=16, C=8", {16, 1024, 1024, 8, 1, DTYPE_BF16}, 1.9},
        {"Fig. S3: 1024^2, B=256, C=1", {256, 1024, 1024, 1, 1, DTYPE_BF16}, 3.9},
    };
    for (const auto &pc : paper) {
        const Result r = run_config(&ctx, pc.cf, DEFAULT_TUNE);
        const double gbs = r.fwd_must / (r.fwd_ms * 1e-3) / 1e9;
        fprintf(out, "  %-30s fwd %8.3f ms  %7.0f GB/s  %5.1f%% of copy   paper (A100) %.1f ms\n",
                pc.what, r.fwd_ms, gbs, 100 * gbs / copy, pc.paper_ms);
    }

    cuda_ctx_destroy(&ctx);
    return 0;
}

extern "C" int cuda_bench_gspn_config(FILE *out, int B, int H, int W, int Cc, int shared, int cg,
                                      int vec, int stages, int prefetch, int dirs, int reps) {
    if (cuda_device_count() == 0) return 1;
    Ctx ctx = cuda_ctx_create(0, DTYPE_BF16);
    const Config cf = {B, H, W, Cc, shared, DTYPE_BF16};
    const Tune tu = {cg, vec, stages, prefetch, dirs};
    const Result r = run_config(&ctx, cf, tu, reps);
    if (reps > 0) print_row(out, cf, tu, r, copy_gbs(&ctx));
    cuda_ctx_destroy(&ctx);
    return 0;
}
