// CUDA: bilinear resize of a channels-last token grid, half-pixel centres (kernels/ops.h;
// CPU reference kernels/cpu/resize.c, whose per-axis tap formula — PyTorch's
// interpolate(align_corners=False, antialias=False) — is evaluated here in the same fp32
// operations, each rounded as written (no fused multiply-add), so both pick the same taps).
//
// Backward is a gather, not a scatter: each input pixel adds the contributions of the output
// pixels that read it, output rows then columns in increasing order, and adds the total to dx
// once. No atomics; the result is bitwise the same on every run. The output range that reads
// each input row / column is contiguous (the taps move monotonically) and is found first by a
// small kernel into scratch.
#include "cuda_elem.cuh"

struct ResizeTap { int i0, i1; float l0, l1; };

__device__ __forceinline__ ResizeTap resize_tap(int in, int out, int dst) {
    if (in == out) return ResizeTap{dst, dst, 1.0f, 0.0f};
    float scale = __fdiv_rn((float)in, (float)out);
    float src = __fsub_rn(__fmul_rn(scale, __fadd_rn((float)dst, 0.5f)), 0.5f);
    if (src < 0.0f) src = 0.0f;
    int i0 = (int)src;
    if (i0 > in - 1) i0 = in - 1;
    float l1 = fminf(fmaxf(__fsub_rn(src, (float)i0), 0.0f), 1.0f);
    return ResizeTap{i0, i0 + (i0 < in - 1 ? 1 : 0), __fsub_rn(1.0f, l1), l1};
}

// Weight of input index i in output index o along one axis.
__device__ __forceinline__ float resize_weight(const ResizeTap &t, int i) {
    return (t.i0 == i ? t.l0 : 0.0f) + (t.i1 == i ? t.l1 : 0.0f);
}

typedef struct { int B, H, W, H2, W2, C; } ResizeDims;

static ResizeDims resize_dims(const char *op, const Tensor *x, const Tensor *y) {
    cuda_check_tensor(op, "x", x);
    cuda_check_tensor(op, "y", y);
    CG_CHECK(x->ndim == 4 && y->ndim == 4 && x->shape[0] == y->shape[0] &&
             x->shape[3] == y->shape[3] && x->shape[1] > 0 && x->shape[2] > 0 &&
             y->shape[1] > 0 && y->shape[2] > 0, "",
             "op %s: expected grids (B,H,W,C) -> (B,H2,W2,C), got rank %d -> rank %d", op,
             x->ndim, y->ndim);
    cuda_check_same_dtype(op, "y", y, "x", x);
    return ResizeDims{x->shape[0], x->shape[1], x->shape[2], y->shape[1], y->shape[2], x->shape[3]};
}

template <typename T> struct ResizeFwdOp {
    const T *x;
    T *y;
    int H, W, H2, W2;
    IndexDiv C;
    template <int V> __device__ void apply(size_t i) const {
        size_t pix = C.div(i), c = i - pix * C.m;
        int ow = (int)(pix % W2);
        size_t t = pix / W2;
        int oh = (int)(t % H2);
        size_t b = t / H2;
        ResizeTap th = resize_tap(H, H2, oh), tw = resize_tap(W, W2, ow);
        const T *r0 = x + ((b * H + th.i0) * W) * C.m + c, *r1 = x + ((b * H + th.i1) * W) * C.m + c;
        float a[V], bb[V], cc[V], d[V], out[V];
        load_v<V>(r0 + tw.i0 * C.m, a);
        load_v<V>(r0 + tw.i1 * C.m, bb);
        load_v<V>(r1 + tw.i0 * C.m, cc);
        load_v<V>(r1 + tw.i1 * C.m, d);
        #pragma unroll
        for (int j = 0; j < V; j++)
            out[j] = th.l0 * (tw.l0 * a[j] + tw.l1 * bb[j]) + th.l1 * (tw.l0 * cc[j] + tw.l1 * d[j]);
        store_v<V>(y + i, out);
    }
};

// x (B,H,W,C) -> y (B,H2,W2,C)
void cuda_resize_bilinear_fwd(Ctx *ctx, const Tensor *x, Tensor *y) {
    ResizeDims d = resize_dims("resize_bilinear_fwd", x, y);
    bool vec = d.C % 8 == 0 && aligned16(x->data) && aligned16(y->data);
    dispatch_dtype(x->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        launch_map(ctx, y->numel, vec,
                   ResizeFwdOp<T>{(const T *)x->data, (T *)y->data, d.H, d.W, d.H2, d.W2,
                                  index_div((size_t)d.C, y->numel)});
    });
}

// For each input index of each axis, the outputs [lo, hi) that read it (lo >= hi: none).
__global__ void resize_ranges_kernel(int in_h, int out_h, int in_w, int out_w, int2 *rh, int2 *rw) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, in, out;
    int2 *r;
    if (i < in_h) {
        in = in_h, out = out_h, r = rh;
    } else if (i < in_h + in_w) {
        i -= in_h;
        in = in_w, out = out_w, r = rw;
    } else {
        return;
    }
    int lo = out, hi = 0;
    for (int o = 0; o < out; o++) {
        ResizeTap t = resize_tap(in, out, o);
        if (t.i0 == i || t.i1 == i) {
            lo = o < lo ? o : lo;
            hi = o + 1;
        }
    }
    r[i] = make_int2(lo, hi);
}

template <typename T> struct ResizeBwdOp {
    const T *dy;
    T *dx;
    const int2 *rh, *rw;
    int H, W, H2, W2;
    IndexDiv C;
    template <int V> __device__ void apply(size_t i) const {
        size_t pix = C.div(i), c = i - pix * C.m;
        int iw = (int)(pix % W);
        size_t t = pix / W;
        int ih = (int)(t % H);
        size_t b = t / H;
        int2 h = rh[ih], w = rw[iw];
        float acc[V];
        #pragma unroll
        for (int j = 0; j < V; j++) acc[j] = 0.0f;
        for (int oh = h.x; oh < h.y; oh++) {
            float wh = resize_weight(resize_tap(H, H2, oh), ih);
            const T *row = dy + ((b * H2 + oh) * W2) * C.m + c;
            for (int ow = w.x; ow < w.y; ow++) {
                float wgt = wh * resize_weight(resize_tap(W, W2, ow), iw);
                float g[V];
                load_v<V>(row + ow * C.m, g);
                #pragma unroll
                for (int j = 0; j < V; j++) acc[j] += wgt * g[j];
            }
        }
        float d[V];
        load_v<V>(dx + i, d);
        #pragma unroll
        for (int j = 0; j < V; j++) d[j] += acc[j];
        store_v<V>(dx + i, d);
    }
};

// dx (B,H,W,C) += resize^T dy (B,H2,W2,C)
void cuda_resize_bilinear_bwd(Ctx *ctx, const Tensor *dy, Tensor *dx) {
    if (!dx) return;
    ResizeDims d = resize_dims("resize_bilinear_bwd", dx, dy);
    int2 *ranges = (int2 *)cuda_scratch(ctx, (size_t)(d.H + d.W) * sizeof(int2));
    resize_ranges_kernel<<<(unsigned)ceil_div((size_t)(d.H + d.W), 128), 128, 0, cuda_stream_of(ctx)>>>(
        d.H, d.H2, d.W, d.W2, ranges, ranges + d.H);
    CUDA_CHECK_LAUNCH();
    bool vec = d.C % 8 == 0 && aligned16(dy->data) && aligned16(dx->data);
    dispatch_dtype(dx->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        launch_map(ctx, dx->numel, vec,
                   ResizeBwdOp<T>{(const T *)dy->data, (T *)dx->data, ranges, ranges + d.H, d.H,
                                  d.W, d.H2, d.W2, index_div((size_t)d.C, dx->numel)});
    });
}
