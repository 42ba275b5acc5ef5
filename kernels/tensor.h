// A tensor is a view: shape, dtype, device and a data pointer it does not own.
// Memory comes from the per-step Arena (activations) or the ParamTable (parameters).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TENSOR_MAX_DIMS 5

typedef enum { DTYPE_F32 = 0, DTYPE_BF16 = 1 } DType;
typedef enum { DEVICE_CPU = 0, DEVICE_CUDA = 1 } Device;

typedef struct Tensor {
    void *data;                  // numel elements of dtype on device
    struct Tensor *grad;         // dL/dthis, same shape; NULL until backward reaches it
    int ndim;
    int shape[TENSOR_MAX_DIMS];  // row-major, last dim contiguous
    size_t numel;
    DType dtype;
    Device device;
    bool requires_grad;          // parameters that train, and anything computed from them
} Tensor;

size_t dtype_size(DType dt);
const char *dtype_name(DType dt);

// Fills ndim/shape/numel; data stays as given.
void tensor_set_shape(Tensor *t, int ndim, const int *shape);
// Product of shape[from..ndim-1] and of shape[0..to-1].
size_t tensor_inner(const Tensor *t, int from);
size_t tensor_outer(const Tensor *t, int to);
static inline int tensor_last(const Tensor *t) { return t->shape[t->ndim - 1]; }
static inline size_t tensor_rows(const Tensor *t) { return t->numel / (size_t)tensor_last(t); }
static inline size_t tensor_bytes(const Tensor *t) { return t->numel * dtype_size(t->dtype); }
static inline float *tensor_f32(const Tensor *t) { return (float *)t->data; }
bool tensor_same_shape(const Tensor *a, const Tensor *b);
// "(2, 3, 5)" into buf.
const char *tensor_shape_str(const Tensor *t, char *buf, size_t n);
// A view of t with another shape of the same numel (no copy).
Tensor tensor_view(const Tensor *t, int ndim, const int *shape);
// fp32 <-> bf16, round to nearest even (as __float2bfloat16); NaN stays NaN.
uint16_t f32_to_bf16(float f);
float bf16_to_f32(uint16_t h);

#ifdef __cplusplus
}
#endif
