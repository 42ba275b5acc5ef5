// cgspn: one binary, one command per job (docs/design.md#commands). The entry point stands above the
// folders whose commands it names: train/'s and bench/'s.
#include "../bench/bench.h"
#include "../train/classify.h"
#include "../train/curriculum.h"
#include "../train/data_cmd.h"
#include "../train/describe.h"
#include "../train/distill.h"
#include "../train/export.h"
#include "../train/features.h"
#include "../train/probe.h"
#include "../dist/dist.h"
#include "../kernels/error.h"
#include <stdlib.h>
#include <unistd.h>

typedef struct Command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} Command;

static const Command kCommands[] = {
    {"train", cmd_train, "classification training of a ViT, C-GSPN, hybrid or hierarchical GSPN encoder"},
    {"eval",  cmd_eval,  "top-1/top-5 of given weights on the validation shards"},
    {"distill", cmd_distill, "Stage 1 / Stage 2 distillation of a C-GSPN student from a frozen teacher"},
    {"curriculum", cmd_curriculum, "resolution curriculum: each stage distills from the previous, upsampled"},
    {"export", cmd_export, "write a checkpoint's student without adaptors or optimizer state"},
    {"probe", cmd_probe, "test accuracy of an encoder's head and of a linear probe on its features"},
    {"features", cmd_features, "run an encoder on images; write every block's PP/PB taps (safetensors)"},
    {"data",  cmd_data,  "build, inspect, verify and benchmark image shards (cgspn data --help)"},
    {"describe", cmd_describe, "an encoder's layout, parameters and GMACs per image, from its config"},
    {"bench", cmd_bench, "GPU benchmarks: kernels against the roofline, blocks, training steps"},
};
#define N_COMMANDS (int)(sizeof(kCommands) / sizeof(kCommands[0]))

static void usage(FILE *f) {
    fprintf(f, "cgspn: C-GSPN vision encoders, trained and distilled from C/CUDA\n\n"
               "usage: cgspn COMMAND CONFIG [--key=value ...]\n\ncommands:\n");
    for (int i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-10s %s\n", kCommands[i].name, kCommands[i].summary);
    fprintf(f, "\n`cgspn COMMAND --help` lists every config key with its default.\n"
               "Configs are key = value files (configs/*.cfg); --key=value overrides them.\n");
}

// OpenMP threads that spin while they wait for work (libgomp's default) make a CPU run crawl
// when anything else shares the cores: measured on a loaded 2-core machine, a Fashion-MNIST
// C-GSPN step took 17 s with spinning threads and 0.33 s with passive ones. libgomp reads the
// policy when the program loads, so the first start sets it and runs the binary again; an
// OMP_WAIT_POLICY already set (e.g. active, for a dedicated machine) is left alone.
static void openmp_wait_passively(char **argv) {
    if (getenv("OMP_WAIT_POLICY")) return;
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);   // returns only on failure: go on as we are
}

// In a run of several processes rank 0 alone prints the log (train/data_parallel.h); the
// others keep stderr, where every error names its rank. CGSPN_LOG_ALL_RANKS=1 keeps every log.
static void quiet_other_ranks(const Dist *d) {
    if (d->world <= 1) return;
    char tag[32];   // "rank 3", as dist's own messages name ranks
    snprintf(tag, sizeof tag, "rank %d", d->rank);
    cg_error_set_tag(tag);
    if (d->rank == 0 || getenv("CGSPN_LOG_ALL_RANKS")) return;
    fflush(stdout);
    if (!freopen("/dev/null", "w", stdout))
        fprintf(stderr, "cgspn: %s: warning: cannot silence stdout: %s\n", dist_tag(d), strerror(errno));
}

int main(int argc, char **argv) {
    openmp_wait_passively(argv);
    setvbuf(stdout, NULL, _IOLBF, 0);   // log lines reach a pipe (tee, a job log) as they happen
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return argc < 2 ? 1 : 0;
    }
    for (int i = 0; i < N_COMMANDS; i++) {
        if (strcmp(argv[1], kCommands[i].name) != 0) continue;
        // A world of one unless mpirun, srun or RANK/WORLD_SIZE started this process (dist/dist.h).
        Dist *dist = dist_process_init(&argc, &argv);
        quiet_other_ranks(dist);
        int rc = kCommands[i].run(argc, argv);
        dist_finalize(dist);
        return rc;
    }
    usage(stderr);
    CG_FAIL("see the list of commands above", "unknown command '%s'", argv[1]);
}
