// CPU reference: GELU (kernels/ops.h), elementwise on any shape.
//   GELU_ERF  (PyTorch approximate='none'): y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
//   GELU_TANH (PyTorch approximate='tanh'): y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
#include "../ops.h"
#include "cpu_check.h"
#include "../elementwise_shape.h"
#include <math.h>

#define GELU_SQRT1_2     0.70710678118654752f   // 1 / sqrt(2)
#define GELU_INV_SQRT2PI 0.39894228040143268f   // 1 / sqrt(2 pi)
#define GELU_SQRT2_PI    0.79788456080286536f   // sqrt(2 / pi)
#define GELU_TANH_C      0.044715f

static inline float gelu_value(float x, GeluKind kind) {
    if (kind == GELU_ERF) return 0.5f * x * (1.0f + erff(x * GELU_SQRT1_2));
    float u = GELU_SQRT2_PI * (x + GELU_TANH_C * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

// dy/dx: erf:  Phi(x) + x phi(x), phi the standard normal density;
//        tanh: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh(u).
static inline float gelu_slope(float x, GeluKind kind) {
    if (kind == GELU_ERF)
        return 0.5f * (1.0f + erff(x * GELU_SQRT1_2)) + x * GELU_INV_SQRT2PI * expf(-0.5f * x * x);
    float u = GELU_SQRT2_PI * (x + GELU_TANH_C * x * x * x);
    float t = tanhf(u);
    return 0.5f * (1.0f + t) +
           0.5f * x * (1.0f - t * t) * GELU_SQRT2_PI * (1.0f + 3.0f * GELU_TANH_C * x * x);
}

void cpu_gelu_fwd(Ctx *ctx, const Tensor *x, GeluKind kind, Tensor *y) {
    gelu_check_kind("gelu_fwd", kind);
    cpu_check_f32("gelu_fwd", "x", x);
    cpu_check_numel("gelu_fwd", "y", y, x->numel);
    const float *px = tensor_f32(x);
    float *py = tensor_f32(y);
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < x->numel; i++) py[i] = gelu_value(px[i], kind);
}

// dx += dy * gelu'(x)
void cpu_gelu_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, GeluKind kind, Tensor *dx) {
    if (!dx) return;
    gelu_check_kind("gelu_bwd", kind);
    cpu_check_f32("gelu_bwd", "x", x);
    cpu_check_numel("gelu_bwd", "dy", dy, x->numel);
    cpu_check_numel("gelu_bwd", "dx", dx, x->numel);
    const float *pdy = tensor_f32(dy), *px = tensor_f32(x);
    float *pdx = tensor_f32(dx);
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < x->numel; i++) pdx[i] += pdy[i] * gelu_slope(px[i], kind);
}
