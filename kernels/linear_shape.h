// The geometry of the linear ops (kernels/ops_list.h linear_*) and its checks, shared by the CPU
// and CUDA ops so both accept and refuse the same shapes: w (M, K), PyTorch's (out, in); x any
// tensor whose last dim is K, read as (N, K) with N = its rows; and the fusion their options ask
// for, so both refuse the same combinations. Each backend adds its dtype rules.
#pragma once
#include "tensor.h"
#include "error.h"
#include "ops.h"

typedef struct LinearDims {
    size_t N;   // rows of x
    int K, M;   // inputs, outputs
} LinearDims;

static inline LinearDims linear_dims(const char *op, const Tensor *x, const Tensor *w) {
    char xs[64], ws[64];
    CG_CHECK(w->ndim == 2, "", "op %s: w must be (out, in), got rank %d", op, w->ndim);
    LinearDims d = {0, w->shape[1], w->shape[0]};
    CG_CHECK(tensor_last(x) == d.K, "", "op %s: x %s has last dim %d, w %s takes %d inputs", op,
             tensor_shape_str(x, xs, sizeof xs), tensor_last(x), tensor_shape_str(w, ws, sizeof ws),
             d.K);
    CG_CHECK(d.K > 0 && d.M > 0, "", "op %s: w %s has an empty dimension", op,
             tensor_shape_str(w, ws, sizeof ws));
    d.N = tensor_rows(x);
    return d;
}

// The fusion a linear_fwd or linear_bwd call asks for (kernels/ops.h LinearFwdOpts,
// LinearBwdOpts), each backend's kernel choice.
typedef enum {
    LINEAR_PLAIN,      // no options
    LINEAR_SILU_IN,    // silu_in
    LINEAR_GELU_OUT,   // gelu_out
    LINEAR_GELU_IN,    // gelu_in (linear_bwd)
    LINEAR_RES,        // res (linear_fwd)
} LinearFusion;

// "a + b + ...": the names of the set options, for a refusal.
static inline const char *linear_opts_str(char *buf, size_t n, const char *const *names,
                                          const int *set, int count) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < count; i++)
        if (set[i] && used < n)
            used += (size_t)snprintf(buf + used, n - used, "%s%s", used ? " + " : "", names[i]);
    return buf;
}

// linear_fwd's fusion; refuses two at once and a pre without gelu_out.
static inline LinearFusion linear_fwd_fusion(const LinearFwdOpts *o) {
    if (!o) return LINEAR_PLAIN;
    static const char *const names[] = {"silu_in", "gelu_out", "res"};
    const int set[] = {o->silu_in != 0, o->gelu_out != 0, o->res != NULL};
    char buf[64];
    CG_CHECK(set[0] + set[1] + set[2] <= 1, "run the fusions as separate linear_fwd calls",
             "op linear_fwd: options %s together: no kernel implements that combination (at most "
             "one of silu_in, gelu_out, res)", linear_opts_str(buf, sizeof buf, names, set, 3));
    CG_CHECK(!o->pre || set[1], "",
             "op linear_fwd: pre is gelu_out's output, and gelu_out is not set");
    return set[0] ? LINEAR_SILU_IN : set[1] ? LINEAR_GELU_OUT : set[2] ? LINEAR_RES : LINEAR_PLAIN;
}

// linear_bwd's fusion; refuses two at once, pre without a GELU and dpre_db without gelu_in.
static inline LinearFusion linear_bwd_fusion(const LinearBwdOpts *o) {
    if (!o) return LINEAR_PLAIN;
    static const char *const names[] = {"silu_in", "gelu_out", "gelu_in"};
    const int set[] = {o->silu_in != 0, o->gelu_out != 0, o->gelu_in != 0};
    char buf[64];
    CG_CHECK(set[0] + set[1] + set[2] <= 1, "",
             "op linear_bwd: options %s together: no kernel implements that combination (at most "
             "one of silu_in, gelu_out, gelu_in)", linear_opts_str(buf, sizeof buf, names, set, 3));
    CG_CHECK(!o->pre || set[1] || set[2], "",
             "op linear_bwd: pre is the GELU's input, and neither gelu_out nor gelu_in is set");
    CG_CHECK(!o->dpre_db || set[2], "",
             "op linear_bwd: dpre_db is gelu_in's, and gelu_in is not set");
    return set[0] ? LINEAR_SILU_IN : set[1] ? LINEAR_GELU_OUT
         : set[2] ? LINEAR_GELU_IN : LINEAR_PLAIN;
}
