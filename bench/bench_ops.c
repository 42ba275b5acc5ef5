// `cgspn bench ops` (bench/bench_ops.h).
#include "bench_ops.h"
#include "op_harness.h"
#include "cuda/kernel_bench.h"
#include "../kernels/device.h"
#include <string.h>
#include <time.h>

#pragma weak cuda_bench_copy_gbs

enum { BENCH_OPS_REPS = 20 };

static void bench_line(FILE *out, const char *what, const char *phase, double ms, double bytes,
                       double copy_gbs) {
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    fprintf(out, "  %-58s %-3s %8.3f ms %8.0f GB/s %6.1f%% of copy\n", what, phase, ms, gbs,
            copy_gbs > 0 ? 100.0 * gbs / copy_gbs : 0.0);
}

// The GPU context, or 0 with a line saying there is none; the table's first line.
static int open_gpu(FILE *out, Ctx *ctx, double *copy_gbs, const char *what) {
    if (!device_has_cuda() || device_gpu_count() == 0 || !cuda_bench_copy_gbs) {
        fprintf(out, "bench ops: no CUDA device visible\n");
        return 0;
    }
    *ctx = device_open_gpu(0, DTYPE_BF16);
    const DeviceInfo d = device_info(ctx);
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
    *copy_gbs = cuda_bench_copy_gbs();
    fprintf(out, "cgspn bench ops%s: %s (%d SMs), %s; GB/s = the bytes of the ops' tensor arguments "
            "(twice those added into) / time, against a device copy at %.0f GB/s\n", what, d.name, d.sm_count, date,
            *copy_gbs);
    return 1;
}

// A case's phases timed on ctx in mode, one line each.
static void time_case(FILE *out, const OpCase *c, Ctx *ctx, DType mode, uint64_t seed,
                      double copy_gbs) {
    CaseTensors ct;
    case_tensors_make(&ct, c, ctx, mode, seed, 0);
    char what[160];
    snprintf(what, sizeof what, "%s %s", c->title, dtype_name(mode));
    double bytes, flops;
    double ms = case_time_ms(c, &ct, PHASE_FWD, BENCH_OPS_REPS, &bytes, &flops);
    bench_line(out, what, "fwd", ms, bytes, copy_gbs);
    if (c->bwd) {
        ms = case_time_ms(c, &ct, PHASE_BWD, BENCH_OPS_REPS, &bytes, &flops);
        bench_line(out, what, "bwd", ms, bytes, copy_gbs);
    }
    case_tensors_free(&ct);
}

int bench_ops_run(FILE *out) {
    Ctx ctx;
    double copy_gbs;
    if (!open_gpu(out, &ctx, &copy_gbs, "")) return 1;
    OpCaseList l = {0};
    op_cases_build(&l, CASES_BENCH);
    for (int k = 0; k < l.n; k++) time_case(out, &l.cases[k], &ctx, DTYPE_BF16, (uint64_t)k + 1, copy_gbs);
    op_cases_free(&l);
    device_close(&ctx);
    return 0;
}

// Whether case c runs op (and its title holds title, when set).
static int case_selected(const OpCase *c, const char *op, const char *title) {
    int runs = 0;
    for (int j = 0; j < OPC_MAX_OPS; j++) runs |= c->ops[j] && strcmp(c->ops[j], op) == 0;
    return runs && (!title || strstr(c->title, title));
}

int bench_ops_one(FILE *out, const char *op, const char *title) {
    OpCaseList l = {0};
    op_cases_build(&l, CASES_TEST);
    int any = 0;
    for (int k = 0; k < l.n; k++) any |= case_selected(&l.cases[k], op, title);
    if (!any) {
        fprintf(out, "bench ops: no case runs op '%s'%s%s%s (the names of kernels/ops_list.h)\n", op,
                title ? " with '" : "", title ? title : "", title ? "' in its title" : "");
        op_cases_free(&l);
        return 2;
    }
    Ctx ctx;
    double copy_gbs;
    char what[160];
    snprintf(what, sizeof what, " --op=%s%s%s", op, title ? " --case=" : "", title ? title : "");
    if (!open_gpu(out, &ctx, &copy_gbs, what)) {
        op_cases_free(&l);
        return 1;
    }
    static const DType modes[2] = {DTYPE_F32, DTYPE_BF16};
    for (int k = 0; k < l.n; k++) {
        const OpCase *c = &l.cases[k];
        if (!case_selected(c, op, title)) continue;
        for (int m = 0; m < 2; m++) {
            if ((m == 0 && (c->flags & CASE_NO_F32)) || (m == 1 && (c->flags & CASE_NO_BF16))) continue;
            time_case(out, c, &ctx, modes[m], (uint64_t)k + 1, copy_gbs);
        }
    }
    op_cases_free(&l);
    device_close(&ctx);
    return 0;
}
