// `cgspn bench dwconv` (bench/bench_dwconv.h): every depthwise convolution shape of gspn_t/s/b
// at batch 128, forward and backward, against the copy bandwidth and PyTorch's cuDNN depthwise
// convolution on the same shapes (bench_timm.py --only dwconv, which reads the shape list from
// `cgspn bench dwconv --list`).
#include "bench_dwconv.h"
#include "timm_json.h"
#include "cuda/kernel_bench.h"
#include "../train/config.h"
#include "../train/model_config.h"
#include "../nn/encoder.h"
#include "../kernels/error.h"
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#pragma weak cuda_bench_dwconv

enum { DW_BATCH = 128, DW_MAX = 3 * HIER_MAX_BLOCKS, DW_MODELS = 3 };
static const char *const kModels[DW_MODELS] = {"gspn_t", "gspn_s", "gspn_b"};
// gspn_t's target: its depthwise convolutions, forward + backward, at batch 128.
#define DW_TARGET_T_MS 4.0

typedef struct ModelConvs {
    HierDwconv conv[DW_MAX];
    int n;
} ModelConvs;

static void model_convs(int m, ModelConvs *mc) {
    char path[64];
    snprintf(path, sizeof path, "configs/%s.cfg", kModels[m]);
    Config c;
    config_defaults(&c);
    config_load_file(&c, path);
    EncoderConfig ec = encoder_config_from(&c);
    mc->n = hier_dwconvs(&ec, mc->conv, DW_MAX);
    CG_CHECK(mc->n <= DW_MAX, "", "bench dwconv: %s has %d depthwise convolutions (at most %d)",
             kModels[m], mc->n, DW_MAX);
}

static bool same_shape(const HierDwconv *a, const HierDwconv *b) {
    return a->H == b->H && a->W == b->W && a->C == b->C && a->k == b->k && a->lpu == b->lpu;
}

// The distinct shapes of all three models, in first-seen order.
static int distinct_shapes(const ModelConvs *mc, HierDwconv *out) {
    int n = 0;
    for (int m = 0; m < DW_MODELS; m++)
        for (int i = 0; i < mc[m].n; i++) {
            int j = 0;
            while (j < n && !same_shape(&out[j], &mc[m].conv[i])) j++;
            if (j == n) out[n++] = mc[m].conv[i];
        }
    return n;
}

int bench_dwconv_list(FILE *out) {
    static ModelConvs mc[DW_MODELS];
    static HierDwconv shapes[DW_MODELS * DW_MAX];
    for (int m = 0; m < DW_MODELS; m++) model_convs(m, &mc[m]);
    int n = distinct_shapes(mc, shapes);
    for (int i = 0; i < n; i++)
        fprintf(out, "%d %d %d %d %d %d\n", DW_BATCH, shapes[i].H, shapes[i].W, shapes[i].C,
                shapes[i].k, shapes[i].lpu ? 1 : 0);
    return 0;
}

// Bytes that must move: forward reads x and writes y; backward reads dy and x and writes dx.
static double dw_bytes(const HierDwconv *s, bool bwd) {
    double n = (double)DW_BATCH * s->H * s->W * s->C * (s->lpu ? 4 : 2);
    return bwd ? 3 * n : 2 * n;
}

int bench_dwconv_run(FILE *out) {
    static ModelConvs mc[DW_MODELS];
    static HierDwconv shapes[DW_MODELS * DW_MAX];
    static DwconvCase cases[DW_MODELS * DW_MAX];
    if (!cuda_bench_dwconv) {
        fprintf(out, "bench dwconv: this build has no CUDA backend\n");
        return 1;
    }
    for (int m = 0; m < DW_MODELS; m++) model_convs(m, &mc[m]);
    int n = distinct_shapes(mc, shapes);
    for (int i = 0; i < n; i++)
        cases[i] = (DwconvCase){DW_BATCH, shapes[i].H, shapes[i].W, shapes[i].C, shapes[i].k,
                                shapes[i].lpu, shapes[i].lpu, 0, 0, 0, 0, 0};
    double copy_gbs = 0;
    char device[128];
    if (cuda_bench_dwconv(cases, n, &copy_gbs, device, sizeof device) != 0) {
        fprintf(out, "bench dwconv: no CUDA device visible\n");
        return 1;
    }
    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
    fprintf(out, "cgspn bench dwconv: %s, %s; batch %d; copy %.0f GB/s\n", device, date, DW_BATCH,
            copy_gbs);
    fprintf(out, "fwd: y = conv(x) (+ bias); bwd: dx =, dw (and db); %% of copy = bytes that must "
                 "move (fwd: x, y; bwd: dy, x, dx) / time / copy GB/s\n");
    fprintf(out, "LPU: x + conv(x) (3x3) on the fp32 stream, bf16 weight and bias, the residual in "
                 "both passes; mixer: bf16, no bias. "
                 "torch: cuDNN depthwise conv, channels_last, bf16 (bench_timm.py --only dwconv)\n");
    char *json = timm_json_load(out);
    fprintf(out, "\n%-9s %5s %2s %-5s %8s %7s %8s %7s %9s %9s\n", "grid", "C", "k", "kind", "fwd ms",
            "% copy", "bwd ms", "% copy", "torch fwd", "torch f+b");
    for (int i = 0; i < n; i++) {
        const HierDwconv *s = &shapes[i];
        const DwconvCase *k = &cases[i];
        char grid[16];
        snprintf(grid, sizeof grid, "%dx%d", s->H, s->W);
        double tf = 0, tfb = 0;
        if (json) {
            tf = timm_json_numberf(json, "dwconv/%dx%dx%dk%d/fwd_ms", s->H, s->W, s->C, s->k);
            tfb = timm_json_numberf(json, "dwconv/%dx%dx%dk%d/fwdbwd_ms", s->H, s->W, s->C, s->k);
        }
        fprintf(out, "%-9s %5d %2d %-5s %8.3f %6.1f%% %8.3f %6.1f%% %9.3f %9.3f\n", grid, s->C, s->k,
                s->lpu ? "lpu" : "mixer", k->fwd_ms,
                100.0 * dw_bytes(s, false) / (k->fwd_ms * 1e-3) / 1e9 / copy_gbs, k->bwd_ms,
                100.0 * dw_bytes(s, true) / (k->bwd_ms * 1e-3) / 1e9 / copy_gbs, tf, tfb);
    }
    fprintf(out, "\nLPU after the mixer's up projection (2 proxy channels onto the stream): one op "
                 "(dwconv_fwd's added input; reads x and u, writes y, and mid in training) against "
                 "linear_fwd+res then dwconv_fwd\n");
    fprintf(out, "%-9s %5s %9s %7s %9s %7s %9s %7s\n", "grid", "C", "fused ms", "% copy", "+mid ms",
            "% copy", "2 ops ms", "% copy");
    for (int i = 0; i < n; i++) {
        const HierDwconv *s = &shapes[i];
        const DwconvCase *k = &cases[i];
        if (!s->lpu) continue;
        char grid[16];
        snprintf(grid, sizeof grid, "%dx%d", s->H, s->W);
        // fused: x, u read, y written; + mid; two ops: u, x read, mid written, then mid read, y written
        const double act = dw_bytes(s, false) / 2, u = (double)DW_BATCH * s->H * s->W * 2 * 2;
        const double gbs = copy_gbs * 1e9 * 1e-3 / 100;   // bytes per ms at 1% of copy
        fprintf(out, "%-9s %5d %9.3f %6.1f%% %9.3f %6.1f%% %9.3f %6.1f%%\n", grid, s->C, k->added_ms,
                (2 * act + u) / k->added_ms / gbs, k->added_mid_ms, (3 * act + u) / k->added_mid_ms / gbs,
                k->two_ops_ms, (4 * act + u) / k->two_ops_ms / gbs);
    }
    fprintf(out, "\n%-8s %6s %8s %8s %10s %9s %10s %8s\n", "model", "convs", "fwd ms", "bwd ms",
            "fwd+bwd ms", "roofline", "torch f+b", "vs torch");
    double t_total = 0;   // gspn_t's fwd+bwd, against the target
    for (int m = 0; m < DW_MODELS; m++) {
        double f = 0, b = 0, roof = 0, torch = 0;
        for (int i = 0; i < mc[m].n; i++) {
            int j = 0;
            while (!same_shape(&shapes[j], &mc[m].conv[i])) j++;
            f += cases[j].fwd_ms;
            b += cases[j].bwd_ms;
            roof += (dw_bytes(&shapes[j], false) + dw_bytes(&shapes[j], true)) / (copy_gbs * 1e9) * 1e3;
            const HierDwconv *s = &shapes[j];
            if (json)
                torch += timm_json_numberf(json, "dwconv/%dx%dx%dk%d/fwdbwd_ms", s->H, s->W, s->C, s->k);
        }
        fprintf(out, "%-8s %6d %8.3f %8.3f %10.3f %9.3f %10.3f %7.2fx\n", kModels[m], mc[m].n, f, b,
                f + b, roof, torch, torch > 0 ? torch / (f + b) : 0.0);
        if (m == 0) t_total = f + b;
    }
    fprintf(out, "gspn_t's %d depthwise convolutions, fwd+bwd: %.3f ms (target: at most %.1f ms)\n",
            mc[0].n, t_total, DW_TARGET_T_MS);
    free(json);
    return 0;
}
