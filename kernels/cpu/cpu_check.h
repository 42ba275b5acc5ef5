// Argument checks shared by the CPU ops: a wrong shape stops with a message that names the op,
// the argument and both shapes.
#pragma once
#include "../error.h"
#include "../tensor.h"

// t is a CPU fp32 tensor.
static inline void cpu_check_f32(const char *op, const char *name, const Tensor *t) {
    CG_CHECK(t != NULL, "", "op %s: %s is NULL", op, name);
    CG_CHECK(t->device == DEVICE_CPU && t->dtype == DTYPE_F32,
             "the CPU backend computes in fp32 on host memory",
             "op %s: %s is a %s tensor on the %s, expected fp32 on the CPU", op, name,
             dtype_name(t->dtype), t->device == DEVICE_CPU ? "CPU" : "GPU");
}

// t is CPU fp32 and reads as a (rows, cols) matrix: last dim cols, rows * cols elements.
static inline void cpu_check_matrix(const char *op, const char *name, const Tensor *t,
                                    size_t rows, int cols) {
    cpu_check_f32(op, name, t);
    char buf[64];
    CG_CHECK(tensor_last(t) == cols && t->numel == rows * (size_t)cols, "",
             "op %s: %s has shape %s, expected %zu rows of %d (last dim %d)", op, name,
             tensor_shape_str(t, buf, sizeof buf), rows, cols, cols);
}

// t is CPU fp32 with exactly n elements (any shape).
static inline void cpu_check_numel(const char *op, const char *name, const Tensor *t, size_t n) {
    cpu_check_f32(op, name, t);
    char buf[64];
    CG_CHECK(t->numel == n, "", "op %s: %s has shape %s (%zu elements), expected %zu elements",
             op, name, tensor_shape_str(t, buf, sizeof buf), t->numel, n);
}

// t is CPU fp32 with the same shape as ref.
static inline void cpu_check_same(const char *op, const char *name, const Tensor *t,
                                  const char *ref_name, const Tensor *ref) {
    cpu_check_f32(op, name, t);
    char a[64], b[64];
    CG_CHECK(tensor_same_shape(t, ref), "", "op %s: %s has shape %s, %s has shape %s; they must match",
             op, name, tensor_shape_str(t, a, sizeof a), ref_name,
             tensor_shape_str(ref, b, sizeof b));
}
