// CPU reference: SiLU (kernels/ops.h), elementwise on any shape: y = x * sigmoid(x).
#include "../ops.h"
#include "cpu_check.h"
#include <math.h>

void cpu_silu_fwd(Ctx *ctx, const Tensor *x, Tensor *y) {
    cpu_check_f32("silu_fwd", "x", x);
    cpu_check_numel("silu_fwd", "y", y, x->numel);
    const float *px = tensor_f32(x);
    float *py = tensor_f32(y);
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < x->numel; i++) py[i] = px[i] / (1.0f + expf(-px[i]));
}

// dx += dy * s (1 + x (1 - s)), s = sigmoid(x)
void cpu_silu_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, Tensor *dx) {
    if (!dx) return;
    cpu_check_f32("silu_bwd", "x", x);
    cpu_check_numel("silu_bwd", "dy", dy, x->numel);
    cpu_check_numel("silu_bwd", "dx", dx, x->numel);
    const float *pdy = tensor_f32(dy), *px = tensor_f32(x);
    float *pdx = tensor_f32(dx);
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < x->numel; i++) {
        float s = 1.0f / (1.0f + expf(-px[i]));
        pdx[i] += pdy[i] * s * (1.0f + px[i] * (1.0f - s));
    }
}
