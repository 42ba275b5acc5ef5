// The CUDA micro-benchmarks behind `cgspn bench gspn|gemm|attention` (bench/cuda/*.cu),
// each timing the backend's kernels directly against the device's copy bandwidth or bf16 peak.
// Plain C header (no CUDA includes). Each prints one table (device and date first) to out and
// returns 0, or 1 when no GPU is visible. bench/bench.c reaches them through weak references,
// so a build without CUDA links and says so.
#pragma once
#include <stdio.h>

// The dense bf16 GEMM peak measured on the H100 (TFLOP/s): the FLOP roofline of `bench gemm` and
// of the per-op profiles.
#define BENCH_BF16_PEAK_TFLOPS 770.0

#ifdef __cplusplus
extern "C" {
#endif
// The C-GSPN scan (kernels/cuda/gspn_scan.cu): per config the forward and backward time, the
// bytes that must move, GB/s and percent of the copy bandwidth.
int cuda_bench_gspn(FILE *out);
// One bf16 configuration with a given tuning (Tuning, kernels/cuda/gspn_scan_common.cuh);
// reps = 0 runs forward and backward once, untimed, for a profiler.
int cuda_bench_gspn_config(FILE *out, int B, int H, int W, int Cc, int shared, int cg, int vec,
                           int stages, int prefetch, int dirs, int reps);
// bf16 linear GEMMs through the CUDA ops: per shape and product ms, TFLOP/s, percent of peak.
int cuda_bench_gemm(FILE *out);
// Attention forward and forward+backward time and TFLOP/s, cuDNN path against the fallback,
// bf16, for ViT-B/16 at 224 px (B=256, N=197, 12 heads, D=64) and the so14 ViT at 378 px and
// 1036 px (B=32, N=729 and 5476, 16 heads, D=72).
int cuda_bench_attention(FILE *out);
// One depthwise convolution shape (kernels/cuda/dwconv.cu): B images of H x W x C, k x k;
// x_f32: the input and output fp32 with a bf16 weight (the LPUs on the residual stream), else
// all bf16; bias: with a bias. The bench fills fwd_ms (y = conv(x), plus x for the x_f32 case: the
// LPU's residual) and bwd_ms (dx written, dw, and db when bias), per call, the mean over timed
// repetitions after a warm-up call.
typedef struct DwconvCase {
    int B, H, W, C, k, x_f32, bias;
    double fwd_ms, bwd_ms;
    // LPUs (x_f32) only: the forward after the mixer's up projection (2 proxy channels), as one op
    // (dwconv_fwd's added input) without and with mid, and as the two ops (linear_fwd onto res,
    // then dwconv_fwd)
    double added_ms, added_mid_ms, two_ops_ms;
} DwconvCase;
// GB/s of a 1 GiB device-to-device copy on GPU 0 (bytes read and written), the roofline the
// per-op profile's column is read against; 0 when no GPU is visible.
double cuda_bench_copy_gbs(void);
// Times every case, and a device-to-device copy (*copy_gbs, bytes read and written per second);
// device (n bytes) gets the GPU's name. 1 when no GPU is visible.
int cuda_bench_dwconv(DwconvCase *cases, int n, double *copy_gbs, char *device, size_t device_n);
#ifdef __cplusplus
}
#endif
