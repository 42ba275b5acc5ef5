#include "bench.h"
#include "../train/data_cmd.h"
#include "bench_model.h"
#include "bench_dist.h"
#include "bench_dwconv.h"
#include "bench_ops.h"
#include "../kernels/error.h"
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include "cuda/kernel_bench.h"
#include "../kernels/device.h"

// The CUDA micro-benchmarks are weak references: a build without the CUDA backend links
// without them, and asking for one says so (as kernels/dispatch.c does for ops).
#pragma weak cuda_bench_gspn
#pragma weak cuda_bench_gemm
#pragma weak cuda_bench_attention
#pragma weak cuda_bench_gspn_config

typedef struct Bench {
    const char *name;
    int (*run)(FILE *out);   // NULL: a CUDA micro-benchmark this build does not have
    const char *summary;
    bool gpu_only;           // `all` leaves it out in a build without CUDA
} Bench;

static const Bench kBenches[] = {
    {"gspn", cuda_bench_gspn, "C-GSPN scan fwd/bwd in GB/s vs a device copy (latent 27^2..147^2, 1024^2)", true},
    {"gemm", cuda_bench_gemm, "bf16 linear GEMMs (ViT-B/16, so14 MLP) in TFLOP/s vs the bf16 peak", true},
    {"attention", cuda_bench_attention, "attention fwd/bwd (cuDNN SDPA and fallback), ViT-B/16 and so14", true},
    {"dwconv", bench_dwconv_run, "gspn_t/s/b depthwise convolutions fwd/bwd at batch 128 vs the copy roofline and PyTorch's cuDNN (--list: the shapes)", true},
    {"ops", bench_ops_run, "memory-bound ops (LayerNorm, GELU, AdamW, ...) at training sizes, the op cases of bench/op_cases.c, in GB/s vs a device copy", true},
    {"vit", bench_vit_run, "ViT-B/16 and so14 ViT training steps, grad_checkpoint 0 and 1: img/s, MFU, GPU memory, vs timm eager/compiled", true},
    {"classify", bench_classify_run, "fast GSPN-T/S/B training step and inference img/s at 224 px vs timm convnext, swin and deit (tiny/small/base), ms per GMAC", true},
    {"block", bench_block_run, "one so14-width block at 1036/2058 px: C-GSPN vs attention vs PyTorch SDPA, time and GPU memory", true},
    {"curriculum", bench_curriculum_run, "a curriculum Stage-k step: so14 student at 1036 px + its 756 px teacher (GPU; tiny on a CPU)", false},
    {"data", data_bench_run, "the data loader's img/s at 224 px (decode + augmentation, CPU)", false},
    {NULL, NULL, NULL, false},
};

// `bench gspn --config=B,H,W,Cc,shared,cg,vec,stages,prefetch,dirs,reps`: one scan configuration.
static int bench_gspn_config(const char *spec) {
    int v[11];
    char end;
    const int n = sscanf(spec, "%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d%c", &v[0], &v[1], &v[2], &v[3], &v[4],
                         &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &end);
    CG_CHECK(n == 11 && v[0] > 0 && v[1] > 0 && v[2] > 0 && v[3] > 0 && v[10] >= 0,
             "for example --config=128,56,56,2,1,0,0,0,0,15,25",
             "bench gspn: --config=%s is not 11 comma-separated integers B,H,W,Cc,shared,cg,vec,"
             "stages,prefetch,dirs,reps", spec);
    CG_CHECK(cuda_bench_gspn_config && device_has_cuda(),
             "rebuild on a machine with nvcc on PATH (make clean && make)",
             "bench gspn: this build has no CUDA backend");
    CG_CHECK(device_gpu_count() > 0, "run it on the GPU machine", "bench gspn: no CUDA GPU found");
    return cuda_bench_gspn_config(stdout, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9],
                                  v[10]);
}

static void bench_usage(FILE *f) {
    fprintf(f, "usage: cgspn bench NAME... | all\n"
               "       [mpirun -np N] cgspn bench distill [STUDENT_CFG] [--zero=1] [--memory=1] [--key=value ...]\n"
               "       cgspn bench distill [STUDENT_CFG] --max-batch [--sizes=378,1036]\n"
               "       cgspn bench gspn --config=B,H,W,Cc,shared,cg,vec,stages,prefetch,dirs,reps\n"
               "         (one bf16 scan configuration; reps 0: forward and backward once, untimed, for a\n"
               "         profiler; cg vec stages prefetch 0 0 0 0 and dirs 15 are the defaults)\n"
               "       cgspn bench classify [--only=LABEL] [--config=LABEL:PATH]\n"
               "         (one of gspn_t, gspn_s, gspn_b alone; a model read from another config file)\n"
               "       cgspn bench ops --op=NAME [--case=TEXT]\n"
               "         (every test case of bench/op_cases.c that runs op NAME of kernels/ops_list.h,\n"
               "         with TEXT in its title if given, fp32 and bf16)\n"
               "Runs benchmarks on the GPU and prints their tables (device and date first).\n"
               "`make bench` runs them all and keeps the output in build/bench.txt.\n\nbenchmarks:\n");
    for (const Bench *b = kBenches; b->name; b++) fprintf(f, "  %-10s %s\n", b->name, b->summary);
    fprintf(f, "  %-10s %s\n", "distill", "Stage 2 distillation img/s and peak GPU memory of the so14 "
            "student on 1 GPU and on all ranks (mpirun), the scaling; --memory=1: grad_checkpoint 0 and 1 "
            "beside PyTorch; --max-batch: the largest batch at 378 and 1036 px beside PyTorch's "
            "(cgspn bench distill --help); not part of all");
    if (!device_has_cuda()) fprintf(f, "  (the GPU benchmarks need a build with nvcc on PATH)\n");
}

int cmd_bench(int argc, char **argv) {
    if (argc < 3 || strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0) {
        bench_usage(argc < 3 ? stderr : stdout);
        return argc < 3 ? 1 : 0;
    }
    // distill takes options of its own (and runs under mpirun): bench_dist.h.
    if (strcmp(argv[2], "distill") == 0) {
        printf("== cgspn bench distill");   // with its options: `make bench` runs it more than once
        for (int i = 3; i < argc; i++) printf(" %s", argv[i]);
        printf("\n");
        return bench_distill_cmd(argc, argv, 3);
    }
    if (strcmp(argv[2], "dwconv") == 0 && argc > 3 && strcmp(argv[3], "--list") == 0)
        return bench_dwconv_list(stdout);
    if (strcmp(argv[2], "gspn") == 0 && argc > 3 && strncmp(argv[3], "--config=", 9) == 0)
        return bench_gspn_config(argv[3] + 9);
    if (strcmp(argv[2], "classify") == 0 && argc > 3 && strncmp(argv[3], "--", 2) == 0)
        return bench_classify_cmd(argc, argv, 3);
    if (strcmp(argv[2], "ops") == 0 && argc > 3 && strncmp(argv[3], "--op=", 5) == 0) {
        CG_CHECK(argc == 4 || (argc == 5 && strncmp(argv[4], "--case=", 7) == 0 && argv[4][7]),
                 "cgspn bench ops --op=NAME [--case=TEXT]", "bench ops: unexpected argument '%s'",
                 argv[argc > 5 ? 5 : 4]);
        return bench_ops_one(stdout, argv[3] + 5, argc == 5 ? argv[4] + 7 : NULL);
    }
    int status = 0;
    for (int i = 2; i < argc; i++) {
        bool all = strcmp(argv[i], "all") == 0, found = all;
        for (const Bench *b = kBenches; b->name; b++) {
            if (!all && strcmp(argv[i], b->name) != 0) continue;
            found = true;
            if (b->gpu_only && !device_has_cuda()) {
                if (all) continue;
                CG_FAIL("rebuild on a machine with nvcc on PATH (make clean && make)",
                        "bench %s: this build has no CUDA backend", b->name);
            }
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
