#include "tensor.h"
#include "error.h"

size_t dtype_size(DType dt) { return dt == DTYPE_BF16 ? 2 : 4; }
const char *dtype_name(DType dt) { return dt == DTYPE_BF16 ? "bf16" : "fp32"; }

void tensor_set_shape(Tensor *t, int ndim, const int *shape) {
    CG_CHECK(ndim >= 1 && ndim <= TENSOR_MAX_DIMS, "", "tensor rank %d out of range", ndim);
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < TENSOR_MAX_DIMS; i++) t->shape[i] = i < ndim ? shape[i] : 1;
    for (int i = 0; i < ndim; i++) {
        CG_CHECK(shape[i] >= 0, "", "negative tensor dimension %d", shape[i]);
        t->numel *= (size_t)shape[i];
    }
}

size_t tensor_inner(const Tensor *t, int from) {
    size_t n = 1;
    for (int i = from; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

size_t tensor_outer(const Tensor *t, int to) {
    size_t n = 1;
    for (int i = 0; i < to && i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

bool tensor_same_shape(const Tensor *a, const Tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

const char *tensor_shape_str(const Tensor *t, char *buf, size_t n) {
    size_t off = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < t->ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, i ? ", %d" : "%d", t->shape[i]);
    if (off < n) snprintf(buf + off, n - off, ")");
    return buf;
}

Tensor tensor_view(const Tensor *t, int ndim, const int *shape) {
    Tensor v = *t;
    tensor_set_shape(&v, ndim, shape);
    CG_CHECK(v.numel == t->numel, "", "view of %zu elements as %zu elements", t->numel, v.numel);
    v.grad = NULL;
    return v;
}

uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return (uint16_t)(u >> 16 | ((u & 0xffff) ? 0x40 : 0));
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
