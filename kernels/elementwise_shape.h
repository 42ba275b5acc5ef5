// The shapes of the elementwise, broadcast and layer-scale ops (kernels/ops_list.h: accumulate,
// add, scale, add_bcast, cast_colsum, layer_scale) and their refusals, and the GELU kinds, shared
// by the CPU and CUDA ops so both accept and refuse the same calls. A backend adds its own device
// and dtype rules.
#pragma once
#include "tensor.h"
#include "error.h"
#include "ops.h"

// The GELU forms the ops know (gelu, linear's GELU fusions, mlp_residual).
static inline void gelu_check_kind(const char *op, GeluKind kind) {
    CG_CHECK(kind == GELU_ERF || kind == GELU_TANH, "gelu is erf (exact) or tanh",
             "op %s: unknown GELU kind %d", op, (int)kind);
}

// t holds as many elements as ref (any shapes).
static inline void ew_check_numel(const char *op, const char *name, const Tensor *t,
                                  const char *ref_name, const Tensor *ref) {
    CG_CHECK(t->numel == ref->numel, "", "op %s: %s has %zu elements, %s has %zu", op, name,
             t->numel, ref_name, ref->numel);
}

// The R rows of x read as (R, P): a broadcast of P elements over them (add_bcast's p and dp).
static inline size_t bcast_rows(const char *op, const Tensor *x, size_t P) {
    size_t R = P ? x->numel / P : 0;
    CG_CHECK(P > 0 && R * P == x->numel, "", "op %s: %zu elements do not split into rows of %zu",
             op, x->numel, P);
    return R;
}

// The rows of x (R, C) under a layer scale g (C): C is x's last dim.
static inline size_t layer_scale_rows(const char *op, const Tensor *x, const Tensor *g) {
    size_t C = g->numel;
    CG_CHECK(C > 0 && (size_t)tensor_last(x) == C && x->numel % C == 0, "",
             "op %s: last dim %d, gamma has %zu elements", op, tensor_last(x), C);
    return x->numel / C;
}

// cast_colsum's colsum holds one sum per column of x: its last dim. Returns it.
static inline size_t colsum_width(const char *op, const Tensor *x, const Tensor *colsum) {
    size_t P = (size_t)tensor_last(x);
    CG_CHECK(colsum->numel == P, "", "op %s: colsum has %zu elements, x's last dim is %zu", op,
             colsum->numel, P);
    return P;
}
