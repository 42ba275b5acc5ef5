// `cgspn bench gspn`: the C-GSPN scan (kernels/cuda/gspn_scan.cu) timed against the device's copy
// bandwidth. Plain C header (no CUDA includes), so the CLI can call it.
#pragma once
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif
// Prints one table (device, date, copy bandwidth, then per config the forward and backward time,
// bytes that must move, GB/s and percent of the copy bandwidth) to out. Returns 0, or 1 when no
// GPU is visible.
int cuda_bench_gspn(FILE *out);
// One bf16 configuration with a given tuning (kernels/cuda/gspn_scan.cu's Tuning); reps = 0 runs
// forward and backward once, untimed, for a profiler.
int cuda_bench_gspn_config(FILE *out, int B, int H, int W, int Cc, int shared, int cg, int vec,
                           int stages, int prefetch, int dirs, int reps);
#ifdef __cplusplus
}
#endif
