// CUDA: attention pooling with one query per head (kernels/ops.h attention_pool_fwd; CPU
// reference kernels/cpu/attention.c), forward only: SigLIP's MAP head in frozen teachers.
// One block per (b, h): the N scores in shared memory, their max and sum by block reductions in
// a fixed order, then each thread a channel of the head's weighted sum of values.
#include "cuda_elem.cuh"

enum { POOL_THREADS = 128 };

// A reduction over the block of POOL_THREADS threads, the result in every thread.
template <bool MAX> __device__ float pool_block_reduce(float v, float *part) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    float r = part[0];
    for (int w = 1; w < POOL_THREADS / 32; w++) r = MAX ? fmaxf(r, part[w]) : r + part[w];
    __syncthreads();   // part is reused by the next reduction
    return r;
}

template <typename TQ, typename T>
__global__ void attention_pool_kernel(const TQ *__restrict__ q, const T *__restrict__ kv,
                                      T *__restrict__ out, int N, int C, int H, float scale) {
    extern __shared__ float smem[];   // qh (D), then the scores (N)
    __shared__ float part[POOL_THREADS / 32];
    int b = blockIdx.x / H, h = blockIdx.x % H, D = C / H;
    float *qh = smem, *S = smem + D;
    for (int d = threadIdx.x; d < D; d += POOL_THREADS) load_v<1>(q + h * D + d, &qh[d]);
    __syncthreads();
    const T *kvb = kv + (size_t)b * N * 2 * C;
    float mx = -INFINITY;
    for (int n = threadIdx.x; n < N; n += POOL_THREADS) {
        const T *k = kvb + (size_t)n * 2 * C + h * D;
        float s = 0;
        for (int d = 0; d < D; d++) {
            float kd;
            load_v<1>(k + d, &kd);
            s += qh[d] * kd;
        }
        S[n] = scale * s;
        mx = fmaxf(mx, S[n]);
    }
    mx = pool_block_reduce<true>(mx, part);
    float sum = 0;
    for (int n = threadIdx.x; n < N; n += POOL_THREADS) {
        S[n] = __expf(S[n] - mx);
        sum += S[n];
    }
    float inv = 1.0f / pool_block_reduce<false>(sum, part);   // also orders S's writes
    for (int d = threadIdx.x; d < D; d += POOL_THREADS) {
        const T *v = kvb + C + h * D + d;
        float o = 0;
        for (int n = 0; n < N; n++) {
            float vd;
            load_v<1>(v + (size_t)n * 2 * C, &vd);
            o += S[n] * vd;
        }
        o *= inv;
        store_v<1>(out + (size_t)b * C + h * D + d, &o);
    }
}

void cuda_attention_pool_fwd(Ctx *ctx, const Tensor *q, const Tensor *kv, int heads, Tensor *out) {
    const char *op = "attention_pool_fwd";
    cuda_check_tensor(op, "q", q);
    cuda_check_tensor(op, "kv", kv);
    cuda_check_tensor(op, "out", out);
    int C = (int)q->numel;
    CG_CHECK(heads > 0 && C % heads == 0 && kv->ndim == 3 && kv->shape[2] == 2 * C &&
             out->numel == (size_t)kv->shape[0] * C, "", "op %s: q of %d, kv of rank %d, out of "
             "%zu, %d heads", op, C, kv->ndim, out->numel, heads);
    cuda_check_same_dtype(op, "out", out, "kv", kv);
    int B = kv->shape[0], N = kv->shape[1], D = C / heads;
    if (B == 0 || N == 0) return;
    size_t smem = sizeof(float) * ((size_t)D + N);
    CG_CHECK(smem <= 48 * 1024, "", "op %s: %d tokens of head dim %d exceed the kernel's shared "
             "memory (48 KiB)", op, N, D);
    cudaStream_t s = cuda_stream_of(ctx);
    dispatch_dtype2(q->dtype, kv->dtype, [&](auto tq, auto tkv) {
        using TQ = TAG_T(tq);
        using T = TAG_T(tkv);
        attention_pool_kernel<TQ, T><<<(unsigned)(B * heads), POOL_THREADS, smem, s>>>(
            (const TQ *)q->data, (const T *)kv->data, (T *)out->data, N, C, heads,
            1.0f / sqrtf((float)D));
    });
    CUDA_CHECK_LAUNCH();
}
