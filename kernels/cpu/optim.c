// CPU reference: optimizer ops (kernels/ops.h) — the sum of squares behind the global gradient
// norm, and the AdamW update of one parameter tensor.
#include <math.h>
#include "../ops.h"
#include "../error.h"
#include "../optim_shape.h"

// Elements per partial sum of sumsq; partials are added in index order (thread-count independent).
#define SUMSQ_BLOCK 4096

// sumsq (1) += sum of x^2. Summed in double, then added to the fp32 scalar.
void cpu_sumsq(Ctx *ctx, const Tensor *x, Tensor *sumsq) {
    sumsq_check("sumsq", sumsq);
    const float *px = tensor_f32(x);
    size_t n = x->numel, blocks = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    double *part = cg_malloc((blocks ? blocks : 1) * sizeof(double));
    #pragma omp parallel for
    for (size_t blk = 0; blk < blocks; blk++) {
        size_t end = (blk + 1) * SUMSQ_BLOCK < n ? (blk + 1) * SUMSQ_BLOCK : n;
        double s = 0;
        for (size_t i = blk * SUMSQ_BLOCK; i < end; i++) s += (double)px[i] * px[i];
        part[blk] = s;
    }
    double total = 0;
    for (size_t blk = 0; blk < blocks; blk++) total += part[blk];
    tensor_f32(sumsq)[0] += (float)total;
    free(part);
}

// AdamW, PyTorch semantics (torch.optim.AdamW, amsgrad=False, maximize=False):
//   g = grad * grad_scale
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr * (m / (1 - b1^step) / (sqrt(v / (1 - b2^step)) + eps) + wd * p)
// Written as PyTorch evaluates it: the decay p *= 1 - lr wd first (decoupled; it uses the old p
// either way), then p -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps), eps outside the sqrt.
void cpu_adamw(Ctx *ctx, Tensor *param, Tensor *master, const Tensor *grad, Tensor *m,
               Tensor *v, const AdamWArgs *args) {
    CG_CHECK(master == NULL && param->dtype == DTYPE_F32, "", "op adamw: the CPU backend keeps "
             "fp32 parameters and takes no master copy");
    adamw_check("adamw", param, master, grad, m, v, args);
    const float b1 = args->beta1, b2 = args->beta2, eps = args->eps, scale = args->grad_scale;
    const double bc1 = 1.0 - pow((double)b1, args->step);
    const double bc2 = 1.0 - pow((double)b2, args->step);
    const float step_size = (float)(args->lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
    const float decay = 1.0f - args->lr * args->weight_decay;
    float *p = tensor_f32(param), *pm = tensor_f32(m), *pv = tensor_f32(v);
    const float *pg = tensor_f32(grad);
    const int runs = args->n_decay_runs > 0 ? args->n_decay_runs : 1;
    CG_CHECK(args->n_decay_runs <= 0 || args->decay_ends[runs - 1] == param->numel, "",
             "op adamw: the decay runs end at %llu, the tensors hold %zu elements",
             (unsigned long long)args->decay_ends[runs - 1], param->numel);
    for (int r = 0; r < runs; r++) {
        const size_t lo = args->n_decay_runs > 0 && r > 0 ? args->decay_ends[r - 1] : 0;
        const size_t hi = args->n_decay_runs > 0 ? args->decay_ends[r] : param->numel;
        const float d = args->n_decay_runs > 0 && !args->decay_on[r] ? 1.0f : decay;
        #pragma omp parallel for
        for (size_t i = lo; i < hi; i++) {
            float g = pg[i] * scale;
            pm[i] = b1 * pm[i] + (1.0f - b1) * g;
            pv[i] = b2 * pv[i] + (1.0f - b2) * g * g;
            float denom = sqrtf(pv[i]) / bc2_sqrt + eps;
            p[i] = p[i] * d - step_size * pm[i] / denom;
        }
    }
}
