// train/memory_report.h.
#include "memory_report.h"
#include "../kernels/device.h"
#include <stdbool.h>

MemoryPlan memory_plan(const Ctx *ctx, const ParamTable *const *tables, int n_tables,
                       const Arena *arena) {
    MemoryPlan m = {0};
    for (int i = 0; i < n_tables; i++) {
        const ParamTable *t = tables[i];
        m.params += t->total * dtype_size(t->dtype) + (t->grads ? t->total * sizeof(float) : 0);
        m.masters += params_state_bytes(t, PARAM_STATE_MASTER);
        m.optimizer += params_state_bytes(t, PARAM_STATE_M) + params_state_bytes(t, PARAM_STATE_V);
    }
    m.activations = arena->reserved;
    const size_t counted = m.params + m.masters + m.optimizer + m.activations;
    const size_t held = device_memory_use(ctx).now;
    m.workspaces = held > counted ? held - counted : 0;
    m.total = counted + m.workspaces;
    return m;
}

#define GIB 1073741824.0

void memory_plan_print(FILE *f, const MemoryPlan *m) {
    const bool gib = m->total >= GIB;
    const double u = gib ? GIB : 1048576.0;
    const char *fmt = gib ? "%.2f" : "%.1f";
    const char *unit = gib ? "GiB" : "MiB";
    fprintf(f, "memory plan: ");
    fprintf(f, fmt, m->total / u);
    fprintf(f, " %s", unit);
    const char *names[5] = {"parameters", "masters", "optimizer", "activations", "workspaces"};
    const size_t parts[5] = {m->params, m->masters, m->optimizer, m->activations, m->workspaces};
    for (int i = 0; i < 5; i++) {
        fprintf(f, "%s%s ", i ? " + " : " = ", names[i]);
        fprintf(f, fmt, parts[i] / u);
    }
    fprintf(f, " %s (per device)\n", unit);
}

void memory_header_print(FILE *f, const MemoryPlan *m) {
    char a[32], b[32], c[32];
    fprintf(f, "memory: parameters %s + masters %s + optimizer %s held; activations and workspaces "
               "are planned in the first step (per device)\n", format_bytes(m->params, a, sizeof a),
            format_bytes(m->masters, b, sizeof b), format_bytes(m->optimizer, c, sizeof c));
}

const char *format_bytes(size_t bytes, char *buf, size_t n) {
    if (bytes >= GIB) snprintf(buf, n, "%.2f GiB", bytes / GIB);
    else snprintf(buf, n, "%.1f MiB", bytes / 1048576.0);
    return buf;
}

size_t memory_peak_take(Ctx *ctx) {
    const size_t peak = device_memory_use(ctx).peak;
    device_memory_reset_peak(ctx);
    return peak;
}
