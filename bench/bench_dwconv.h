// `cgspn bench dwconv` (bench/bench_dwconv.c): the depthwise convolutions of the fast GSPN
// classifiers on the GPU, beside PyTorch's cuDNN depthwise convolution on the same shapes.
#pragma once
#include <stdio.h>

// Every distinct depthwise convolution shape of gspn_t/s/b (configs/gspn_*.cfg) at batch 128:
// forward and backward ms and percent of the copy bandwidth, torch's times from
// build/bench_timm.json; per model the sum over its convolutions and the copy roofline.
int bench_dwconv_run(FILE *out);
// The same shapes, one per line: "B H W C k lpu" (lpu 1: fp32 input with a bias), for
// bench/bench_timm.py --only dwconv.
int bench_dwconv_list(FILE *out);
