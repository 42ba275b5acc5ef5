// `cgspn bench ops` (bench/bench_ops.c): the memory-bound ops at training sizes, the cases of
// bench/op_cases.h's CASES_BENCH set, in GB/s against a device-to-device copy.
#pragma once
#include <stdio.h>

// Per case its forward and (where it has one) backward: ms, GB/s of the bytes its ops' tensor
// arguments hold, percent of the copy bandwidth. 1 when no GPU is visible.
int bench_ops_run(FILE *out);
// The test cases (CASES_TEST) that run op `op` (and whose titles hold `title`, when not NULL),
// timed the same way in fp32 and bf16: the timing column of the op harness, and a way to run a
// few cases under a profiler or compute-sanitizer. 1 when no GPU is visible, 2 when no case runs
// op.
int bench_ops_one(FILE *out, const char *op, const char *title);
