// `cgspn bench distill`: Stage 2 distillation img/s of the so14 C-GSPN student on 1 GPU and on
// every rank of an mpirun launch, and the scaling, with each rank's peak GPU memory;
// --memory=1 and --max-batch set it beside PyTorch's ViT -> ViT step.
// bench/bench_dist.c says what is timed. Runs on the CPU too (device = cpu, with small configs:
// the CPU test of its logic, tests/test_bench_dist.c).
#pragma once
#include "../train/config.h"

// argv[first..argc-1]: [STUDENT_CFG] [--steps=N] [--warmup=N] [--overlap=0|1] [--profile=1]
// [--memory=1] [--max-batch [--sizes=378,1036] [--max-batch-cap=N]] [--key=value ...]
int bench_distill_cmd(int argc, char **argv, int first);
