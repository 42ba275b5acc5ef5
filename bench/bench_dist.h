// `cgspn bench distill`: Stage 2 distillation img/s of the so14 C-GSPN student on 1 GPU and on
// every rank of an mpirun launch, and the scaling (issue 8). bench/bench_dist.c says what is
// timed. Runs on the CPU too (device = cpu, with small configs: the CPU test of its logic).
#pragma once

// argv[first..argc-1]: [STUDENT_CFG] [--steps=N] [--warmup=N] [--overlap=0|1] [--key=value ...]
int bench_distill_cmd(int argc, char **argv, int first);
