#include "bench.h"
#include "../nn/error.h"
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#ifdef CGSPN_CUDA
#include "../kernels/cuda/gemm_bench.h"
#endif

typedef struct Bench {
    const char *name;
    int (*run)(FILE *out);
    const char *summary;
} Bench;

static const Bench kBenches[] = {
#ifdef CGSPN_CUDA
    {"gemm", cuda_bench_gemm, "bf16 linear GEMMs (ViT-B/16, so14 MLP) in TFLOP/s vs the bf16 peak"},
#endif
    {NULL, NULL, NULL},
};

static void bench_usage(FILE *f) {
    fprintf(f, "usage: cgspn bench NAME... | all\n"
               "Runs benchmarks on the GPU and prints their tables (device and date first).\n"
               "`make bench` runs them all and keeps the output in build/bench.txt.\n\nbenchmarks:\n");
    for (const Bench *b = kBenches; b->name; b++) fprintf(f, "  %-10s %s\n", b->name, b->summary);
    if (!kBenches[0].name) fprintf(f, "  (none: this build has no CUDA backend)\n");
}

int cmd_bench(int argc, char **argv) {
    if (argc < 3 || strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0) {
        bench_usage(argc < 3 ? stderr : stdout);
        return argc < 3 ? 1 : 0;
    }
    CG_CHECK(kBenches[0].name != NULL, "rebuild on a machine with nvcc on PATH",
             "cgspn bench needs the CUDA backend; this build has none");
    int status = 0;
    for (int i = 2; i < argc; i++) {
        bool all = strcmp(argv[i], "all") == 0, found = all;
        for (const Bench *b = kBenches; b->name; b++) {
            if (!all && strcmp(argv[i], b->name) != 0) continue;
            found = true;
            printf("== cgspn bench %s\n", b->name);
            status |= b->run(stdout);
            printf("\n");
        }
        if (!found) {
            bench_usage(stderr);
            CG_FAIL("see the list above", "unknown benchmark '%s'", argv[i]);
        }
    }
    return status;
}
