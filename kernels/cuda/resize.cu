// CUDA: bilinear resize of a channels-last token grid, half-pixel centres (kernels/ops.h;
// CPU reference kernels/cpu/resize.c, whose per-axis tap formula — PyTorch's
// interpolate(align_corners=False, antialias=False) — is evaluated here in the same fp32
// operations, each rounded as written (no fused multiply-add), so both pick the same taps).
//
// Backward is a gather, not a scatter: each input pixel adds the contributions of the output
// pixels that read it, output rows then columns in increasing order, and adds the total to dx
// once. No atomics; the result is bitwise the same on every run. The output range that reads
// each input row / column is contiguous (the taps move monotonically). A small kernel first
// writes the taps of every output row and column, and those ranges, to scratch.
#include "cuda_elem.cuh"
#include "../resize_shape.h"

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

// The grids' shapes (kernels/resize_shape.h) and this backend's rules: on the GPU, one dtype.
static ResizeDims resize_checked(const char *op, const Tensor *x, const Tensor *y) {
    cuda_check_tensor(op, "x", x);
    cuda_check_tensor(op, "y", y);
    cuda_check_same_dtype(op, "y", y, "x", x);
    return resize_dims(op, x, y);
}

// Per-axis tables in scratch: the taps of every output row (th) and column (tw), and for every
// input row (rh) and column (rw) the outputs [x, y) that read it (x >= y: none).
struct ResizeTables {
    ResizeTap *th, *tw;
    int2 *rh, *rw;
};

__device__ int2 resize_range(int in, int out, int i) {
    int lo = out, hi = 0;
    for (int o = 0; o < out; o++) {
        ResizeTap t = resize_tap(in, out, o);
        if (t.i0 == i || t.i1 == i) {
            lo = o < lo ? o : lo;
            hi = o + 1;
        }
    }
    return make_int2(lo, hi);
}

__global__ void resize_tables_kernel(int H, int W, int H2, int W2, ResizeTables t) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < H2) { t.th[i] = resize_tap(H, H2, i); return; }
    i -= H2;
    if (i < W2) { t.tw[i] = resize_tap(W, W2, i); return; }
    i -= W2;
    if (i < H) { t.rh[i] = resize_range(H, H2, i); return; }
    i -= H;
    if (i < W) t.rw[i] = resize_range(W, W2, i);
}

static ResizeTables resize_tables(Ctx *ctx, const ResizeDims &d) {
    size_t taps = (size_t)(d.H2 + d.W2) * sizeof(ResizeTap), ranges = (size_t)(d.H + d.W) * sizeof(int2);
    char *p = (char *)cuda_scratch(ctx, taps + ranges);
    ResizeTables t;
    t.th = (ResizeTap *)p;
    t.tw = t.th + d.H2;
    t.rh = (int2 *)(p + taps);
    t.rw = t.rh + d.H;
    int n = d.H2 + d.W2 + d.H + d.W;
    resize_tables_kernel<<<(unsigned)ceil_div((size_t)n, 128), 128, 0, cuda_stream_of(ctx)>>>(
        d.H, d.W, d.H2, d.W2, t);
    CUDA_CHECK_LAUNCH();
    return t;
}

template <typename T> struct ResizeFwdOp {
    const T *x;
    T *y;
    const ResizeTap *th, *tw;
    size_t H, W;
    IndexDiv C, W2, H2;   // i -> (pixel, c), pixel -> (row, ow), row -> (b, oh)
    template <int V> __device__ void apply(size_t i) const {
        size_t pix = C.div(i), c = i - pix * C.m, row = W2.div(pix), b = H2.div(row);
        ResizeTap h = th[row - b * H2.m], w = tw[pix - row * W2.m];
        const T *r0 = x + ((b * H + h.i0) * W) * C.m + c, *r1 = x + ((b * H + h.i1) * W) * C.m + c;
        float a[V], bb[V], cc[V], d[V], out[V];
        load_v<V>(r0 + w.i0 * C.m, a);
        load_v<V>(r0 + w.i1 * C.m, bb);
        load_v<V>(r1 + w.i0 * C.m, cc);
        load_v<V>(r1 + w.i1 * C.m, d);
        #pragma unroll
        for (int j = 0; j < V; j++)
            out[j] = h.l0 * (w.l0 * a[j] + w.l1 * bb[j]) + h.l1 * (w.l0 * cc[j] + w.l1 * d[j]);
        store_v<V>(y + i, out);
    }
};

// x (B,H,W,C) -> y (B,H2,W2,C)
void cuda_resize_bilinear_fwd(Ctx *ctx, const Tensor *x, Tensor *y) {
    ResizeDims d = resize_checked("resize_bilinear_fwd", x, y);
    if (y->numel == 0) return;
    ResizeTables t = resize_tables(ctx, d);
    bool vec = d.C % 8 == 0 && aligned16(x->data) && aligned16(y->data);
    size_t pix = y->numel / d.C;
    dispatch_dtype(x->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        launch_map(ctx, y->numel, vec,
                   ResizeFwdOp<T>{(const T *)x->data, (T *)y->data, t.th, t.tw, (size_t)d.H,
                                  (size_t)d.W, index_div((size_t)d.C, y->numel),
                                  index_div((size_t)d.W2, pix), index_div((size_t)d.H2, pix)});
    });
}

template <typename T> struct ResizeBwdOp {
    const T *dy;
    T *dx;
    ResizeTables t;
    size_t H2, W2;
    IndexDiv C, W, H;   // i -> (pixel, c), pixel -> (row, iw), row -> (b, ih)
    template <int V> __device__ void apply(size_t i) const {
        size_t pix = C.div(i), c = i - pix * C.m, row = W.div(pix), b = H.div(row);
        int ih = (int)(row - b * H.m), iw = (int)(pix - row * W.m);
        int2 rh = t.rh[ih], rw = t.rw[iw];
        float acc[V];
        #pragma unroll
        for (int j = 0; j < V; j++) acc[j] = 0.0f;
        for (int oh = rh.x; oh < rh.y; oh++) {
            float wh = resize_weight(t.th[oh], ih);
            const T *out_row = dy + ((b * H2 + oh) * W2) * C.m + c;
            for (int ow = rw.x; ow < rw.y; ow++) {
                float wgt = wh * resize_weight(t.tw[ow], iw);
                float g[V];
                load_v<V>(out_row + ow * C.m, g);
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
    ResizeDims d = resize_checked("resize_bilinear_bwd", dx, dy);
    if (dx->numel == 0) return;
    ResizeTables t = resize_tables(ctx, d);
    bool vec = d.C % 8 == 0 && aligned16(dy->data) && aligned16(dx->data);
    size_t pix = dx->numel / d.C;
    dispatch_dtype(dx->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        launch_map(ctx, dx->numel, vec,
                   ResizeBwdOp<T>{(const T *)dy->data, (T *)dx->data, t, (size_t)d.H2, (size_t)d.W2,
                                  index_div((size_t)d.C, dx->numel), index_div((size_t)d.W, pix),
                                  index_div((size_t)d.H, pix)});
    });
}
