// Per-op and per-phase GPU time (bench/op_profile.h).
#include "op_profile.h"
#include "../kernels/error.h"
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/device.h"

enum { PROF_MAX = 8192, PROF_NAMES = 160 };

struct OpProfile {
    Ctx *ctx;
    DeviceEvent *ev[2 * PROF_MAX];                    // (op, start|end)
    const char *name[PROF_MAX];
    double bytes[PROF_MAX];                          // its tensor arguments' bytes (ctx.h)
    double flops[PROF_MAX];                          // its products' FLOPs, as reported
    int phase_of[PROF_MAX];                          // the phase each op started in
    DeviceEvent *mark[OP_PROFILE_MAX_PHASES + 1];     // phase starts, then the stop
    const char *phase[OP_PROFILE_MAX_PHASES];
    int n, depth, dropped, n_phases;
    bool stopped;
};

static void profile_hook(Ctx *ctx, const char *op, int end, double bytes) {
    OpProfile *p = ctx->profile_data;
    if (end == CTX_PROFILE_FLOPS) {   // to the outermost op in progress
        if (p->depth > 0 && p->n < PROF_MAX) p->flops[p->n] += bytes;
        return;
    }
    if (!end) {
        if (p->depth++ > 0) return;   // an op called from inside another: counted in it
        if (p->n >= PROF_MAX) {
            p->dropped++;
            return;
        }
        p->name[p->n] = op;
        p->bytes[p->n] = bytes;
        p->flops[p->n] = 0;
        p->phase_of[p->n] = p->n_phases - 1;
        device_event_record(p->ev[2 * p->n]);
    } else {
        if (--p->depth > 0 || p->n >= PROF_MAX) return;
        device_event_record(p->ev[2 * p->n + 1]);
        p->n++;
    }
}

OpProfile *op_profile_start(Ctx *ctx) {
    if (ctx->device != DEVICE_CUDA) return NULL;
    OpProfile *p = cg_calloc(1, sizeof *p);
    for (int i = 0; i < 2 * PROF_MAX; i++) p->ev[i] = device_event_create(ctx);
    for (int i = 0; i <= OP_PROFILE_MAX_PHASES; i++) p->mark[i] = device_event_create(ctx);
    p->ctx = ctx;
    ctx->profile = profile_hook;
    ctx->profile_data = p;
    return p;
}

void op_profile_mark(OpProfile *p, const char *phase) {
    if (!p) return;
    CG_CHECK(p->n_phases < OP_PROFILE_MAX_PHASES && !p->stopped, "",
             "op_profile_mark: at most %d phases, before op_profile_stop", OP_PROFILE_MAX_PHASES);
    p->phase[p->n_phases] = phase;
    device_event_record(p->mark[p->n_phases++]);
}

void op_profile_stop(OpProfile *p) {
    if (!p || p->stopped) return;
    device_event_record(p->mark[p->n_phases]);
    device_event_wait(p->mark[p->n_phases]);
    p->ctx->profile = NULL;
    p->ctx->profile_data = NULL;
    p->stopped = true;
}

void op_profile_free(OpProfile *p) {
    if (!p) return;
    op_profile_stop(p);
    for (int i = 0; i < 2 * PROF_MAX; i++) device_event_free(p->ev[i]);
    for (int i = 0; i <= OP_PROFILE_MAX_PHASES; i++) device_event_free(p->mark[i]);
    free(p);
}

double op_profile_total_ms(const OpProfile *p) {
    if (!p) return 0;
    const DeviceEvent *first = p->n_phases ? p->mark[0] : p->ev[0];
    return p->n || p->n_phases ? device_event_ms(first, p->mark[p->n_phases]) : 0;
}

static int cmp_total(const void *a, const void *b) {
    double x = ((const OpTotal *)a)->ms, y = ((const OpTotal *)b)->ms;
    return x > y ? -1 : x < y;
}

int op_profile_totals(const OpProfile *p, OpTotal *out, int max) {
    if (!p) return 0;
    OpTotal tot[PROF_NAMES];
    int nt = 0;
    for (int i = 0; i < p->n; i++) {
        int k = 0;
        while (k < nt && strcmp(tot[k].name, p->name[i]) != 0) k++;
        if (k == nt && nt < PROF_NAMES) tot[nt++] = (OpTotal){p->name[i], 0, 0, 0, 0};
        if (k < nt) {
            tot[k].calls++;
            tot[k].bytes += p->bytes[i];
            tot[k].flops += p->flops[i];
            tot[k].ms += device_event_ms(p->ev[2 * i], p->ev[2 * i + 1]);
        }
    }
    qsort(tot, (size_t)nt, sizeof *tot, cmp_total);
    if (nt > max) nt = max;
    memcpy(out, tot, (size_t)nt * sizeof *tot);
    return nt;
}

int op_profile_phases(const OpProfile *p, OpPhase *out, int max) {
    if (!p) return 0;
    int n = p->n_phases < max ? p->n_phases : max;
    for (int k = 0; k < n; k++) out[k] = (OpPhase){p->phase[k], device_event_ms(p->mark[k], p->mark[k + 1]), 0, 0};
    for (int i = 0; i < p->n; i++) {
        int k = p->phase_of[i];
        if (k < 0 || k >= n) continue;
        out[k].op_ms += device_event_ms(p->ev[2 * i], p->ev[2 * i + 1]);
        out[k].ops++;
    }
    return n;
}

// One row of the op table: the name column, then calls, ms, % step, GB/s and, with copy_gbs (and
// peak_tflops), % copy, TFLOP/s and % roof.
static void print_row(FILE *out, const char *name, int calls, double ms, double bytes, double flops,
                      double step_ms, double copy_gbs, double peak_tflops) {
    const double s = ms * 1e-3, gbs = s > 0 ? bytes / s / 1e9 : 0;
    fprintf(out, "  %-20s %6d %9.3f %6.1f%% %8.0f", name, calls, ms, 100.0 * ms / step_ms, gbs);
    if (copy_gbs > 0) fprintf(out, " %6.1f%%", 100.0 * gbs / copy_gbs);
    if (copy_gbs > 0 && peak_tflops > 0) {
        const double bound = fmax(bytes / (copy_gbs * 1e9), flops / (peak_tflops * 1e12));
        if (flops > 0) fprintf(out, " %8.1f", s > 0 ? flops / s / 1e12 : 0);
        else fprintf(out, " %8s", "");
        fprintf(out, " %6.1f%%", s > 0 ? 100.0 * bound / s : 0);
    }
    fprintf(out, "\n");
}

// Whether `name` is one of the comma-separated names in `list`.
static bool in_list(const char *list, const char *name) {
    const size_t n = strlen(name);
    for (const char *q = list; (q = strstr(q, name)) != NULL; q += n)
        if ((q == list || q[-1] == ',') && (q[n] == ',' || q[n] == '\0')) return true;
    return false;
}

void op_profile_print(FILE *out, const OpProfile *p, double step_ms, double copy_gbs,
                      double peak_tflops) {
    if (!p) return;
    OpTotal tot[PROF_NAMES];
    const int nt = op_profile_totals(p, tot, PROF_NAMES);
    double sum = 0;
    fprintf(out, "  %-20s %6s %9s %7s %8s %7s", "op", "calls", "ms", "% step", "GB/s", "% copy");
    if (copy_gbs > 0 && peak_tflops > 0) fprintf(out, " %8s %7s", "TFLOP/s", "% roof");
    fprintf(out, "\n");
    for (int k = 0; k < nt; k++) {
        print_row(out, tot[k].name, tot[k].calls, tot[k].ms, tot[k].bytes, tot[k].flops, step_ms,
                  copy_gbs, peak_tflops);
        sum += tot[k].ms;
    }
    fprintf(out, "  %-20s %6d %9.3f %6.1f%%  (the rest: gaps between ops, host waits)\n",
            "all ops", p->n, sum, 100.0 * sum / step_ms);
    if (p->dropped) fprintf(out, "  (%d op calls past the profile's %d not timed)\n", p->dropped, PROF_MAX);
    // CGSPN_PROFILE_CALLS=op,op,...: every call of those ops too, in the order they ran (#1, #2, ...).
    const char *calls = getenv("CGSPN_PROFILE_CALLS");
    if (!calls || !calls[0]) return;
    int seen[PROF_NAMES] = {0};
    for (int i = 0; i < p->n; i++) {
        if (!in_list(calls, p->name[i])) continue;
        int k = 0;
        while (k < nt && strcmp(tot[k].name, p->name[i]) != 0) k++;
        char label[48];
        snprintf(label, sizeof label, "%s #%d", p->name[i], k < nt ? ++seen[k] : 0);
        print_row(out, label, 1, device_event_ms(p->ev[2 * i], p->ev[2 * i + 1]), p->bytes[i],
                  p->flops[i], step_ms, copy_gbs, peak_tflops);
    }
}

void op_profile_print_calls(FILE *out, const OpProfile *p, int per_line) {
    if (!p) return;
    int k = 0;
    for (int ph = -1; ph < p->n_phases; ph++) {
        bool any = false;
        for (int i = 0; i < p->n; i++) {
            if (p->phase_of[i] != ph) continue;
            if (!any) fprintf(out, "  %s:", ph >= 0 ? p->phase[ph] : "before the first mark");
            if (!any || k % per_line == 0) fprintf(out, "\n   ");
            fprintf(out, " %s %.3f", p->name[i], device_event_ms(p->ev[2 * i], p->ev[2 * i + 1]));
            any = true;
            k++;
        }
        if (any) fprintf(out, "\n");
        k = 0;
    }
}
