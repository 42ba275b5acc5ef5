// CUDA: optimizer ops (kernels/ops.h; CPU reference kernels/cpu/optim.c) — the sum of squares
// behind the global gradient norm, and the AdamW update of one parameter tensor, with an fp32
// master copy when the parameter is bf16. Both are single passes at memory bandwidth.
#include "cuda_elem.cuh"
#include "../optim_shape.h"

enum { SUMSQ_THREADS = 256, SUMSQ_MAX_BLOCKS = 1024 };

// Per-block partial sums of x^2; the block count depends on n only, and reduce.cu adds the
// partials in order (deterministic).
template <typename T, int V>
__global__ void __launch_bounds__(SUMSQ_THREADS)
sumsq_partial_kernel(const T *__restrict__ x, size_t n, float *part) {
    size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    float s = 0.0f;
    for (size_t p = tid; p < n / V; p += stride) {
        float v[V];
        load_v<V>(x + p * V, v);
        #pragma unroll
        for (int j = 0; j < V; j++) s += v[j] * v[j];
    }
    if (V > 1)
        for (size_t i = n / V * V + tid; i < n; i += stride) {
            float v = load_or(x, i, 0.0f);
            s += v * v;
        }
    s = block_sum(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// sumsq (1) += sum of x^2
void cuda_sumsq(Ctx *ctx, const Tensor *x, Tensor *sumsq) {
    cuda_check_tensor("sumsq", "x", x);
    cuda_check_f32("sumsq", "sumsq", sumsq);
    sumsq_check("sumsq", sumsq);
    size_t n = x->numel;
    if (n == 0) return;
    size_t nb = ceil_div(n, (size_t)SUMSQ_THREADS * 8);
    unsigned blocks = (unsigned)(nb > SUMSQ_MAX_BLOCKS ? SUMSQ_MAX_BLOCKS : nb);
    float *part = (float *)cuda_scratch(ctx, blocks * sizeof(float));
    bool vec = aligned16(x->data);
    cudaStream_t s = cuda_stream_of(ctx);
    dispatch_dtype(x->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        if (vec) sumsq_partial_kernel<T, 8><<<blocks, SUMSQ_THREADS, 0, s>>>((const T *)x->data, n, part);
        else sumsq_partial_kernel<T, 1><<<blocks, SUMSQ_THREADS, 0, s>>>((const T *)x->data, n, part);
    });
    CUDA_CHECK_LAUNCH();
    cuda_finish_sum(ctx, part, blocks, 1.0, tensor_f32(sumsq), true);
}

// AdamW, PyTorch semantics, in the CPU reference's fp32 operations:
//   g = grad * scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
//   p = p * (1 - lr wd) - (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps)
// MASTER: the fp32 master holds the weights; param receives the result rounded to its dtype.
template <typename TP, typename TG, bool MASTER> struct AdamWOp {
    TP *param;
    float *master;
    const TG *grad;
    float *m, *v;
    float b1, b2, eps, scale, step_size, bc2_sqrt, decay;
    int n_runs;   // AdamWArgs' decay runs (device arrays), 0: every element decays
    const uint64_t *ends;
    const uint8_t *on;
    // The decay factor of elements i .. i + V - 1 (one run: runs end at multiples of 8).
    __device__ float decay_at(size_t i) const {
        if (n_runs == 0) return decay;
        int lo = 0, hi = n_runs - 1;   // the first run ending past i
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (ends[mid] > i) hi = mid;
            else lo = mid + 1;
        }
        return on[lo] ? decay : 1.0f;
    }
    template <int V> __device__ void apply(size_t i) const {
        const float d = decay_at(i);
        float g[V], vm[V], vv[V], p[V];
        load_v<V>(grad + i, g);
        load_v<V>(m + i, vm);
        load_v<V>(v + i, vv);
        if (MASTER) load_v<V>(master + i, p);
        else load_v<V>(param + i, p);
        #pragma unroll
        for (int j = 0; j < V; j++) {
            float gj = g[j] * scale;
            vm[j] = b1 * vm[j] + (1.0f - b1) * gj;
            vv[j] = b2 * vv[j] + (1.0f - b2) * gj * gj;
            float denom = sqrtf(vv[j]) / bc2_sqrt + eps;
            p[j] = p[j] * d - step_size * vm[j] / denom;
        }
        store_v<V>(m + i, vm);
        store_v<V>(v + i, vv);
        if (MASTER) store_v<V>(master + i, p);
        store_v<V>(param + i, p);
    }
};

void cuda_adamw(Ctx *ctx, Tensor *param, Tensor *master, const Tensor *grad, Tensor *m,
                Tensor *v, const AdamWArgs *args) {
    const char *op = "adamw";
    cuda_check_tensor(op, "param", param);
    cuda_check_tensor(op, "grad", grad);
    cuda_check_f32(op, "m", m);
    cuda_check_f32(op, "v", v);
    adamw_check(op, param, master, grad, m, v, args);
    size_t n = param->numel;
    if (master) {
        cuda_check_f32(op, "master", master);
    } else {
        CG_CHECK(param->dtype == DTYPE_F32, "bf16 parameters train through an fp32 master copy",
                 "op adamw: param is %s and no master copy was given", dtype_name(param->dtype));
    }
    const double bc1 = 1.0 - pow((double)args->beta1, args->step);
    const double bc2 = 1.0 - pow((double)args->beta2, args->step);
    float b1 = args->beta1, b2 = args->beta2, eps = args->eps, scale = args->grad_scale;
    float step_size = (float)(args->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    float decay = 1.0f - args->lr * args->weight_decay;
    bool vec = aligned16(param->data) && aligned16(grad->data) && aligned16(m->data) &&
               aligned16(v->data) && (!master || aligned16(master->data));
    const int runs = args->n_decay_runs > 0 ? args->n_decay_runs : 0;
    dispatch_dtype2(param->dtype, grad->dtype, [&](auto tp, auto tg) {
        using TP = TAG_T(tp);
        using TG = TAG_T(tg);
        TP *pp = (TP *)param->data;
        const TG *pg = (const TG *)grad->data;
        if (master)
            launch_map(ctx, n, vec,
                       AdamWOp<TP, TG, true>{pp, tensor_f32(master), pg, tensor_f32(m), tensor_f32(v),
                                             b1, b2, eps, scale, step_size, bc2_sqrt, decay, runs,
                                             args->decay_ends, args->decay_on});
        else
            launch_map(ctx, n, vec,
                       AdamWOp<TP, TG, false>{pp, nullptr, pg, tensor_f32(m), tensor_f32(v), b1, b2,
                                              eps, scale, step_size, bc2_sqrt, decay, runs,
                                              args->decay_ends, args->decay_on});
    });
}
