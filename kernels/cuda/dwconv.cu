// CUDA: depthwise convolution, channels-last, stride 1, zero padding k/2 (kernels/ops.h; CPU
// reference kernels/cpu/dwconv.c). y and dx: one thread per element (adjacent threads adjacent
// channels, so every tap's read is coalesced). dw and db: deterministic column sums over the
// pixels (cuda_colsum.cuh), dw's column c*k*k + t the product of dy and x shifted by tap t.
#include "cuda_colsum.cuh"

typedef struct DwDims { int B, H, W, C, k, p; } DwDims;

static DwDims dw_dims(const char *op, const Tensor *x, const Tensor *w) {
    cuda_check_tensor(op, "x", x);
    cuda_check_tensor(op, "w", w);
    char buf[64];
    CG_CHECK(x->ndim == 4, "", "op %s: x has shape %s, expected (B, H, W, C)", op,
             tensor_shape_str(x, buf, sizeof buf));
    DwDims d = {x->shape[0], x->shape[1], x->shape[2], x->shape[3], w->shape[w->ndim - 1], 0};
    CG_CHECK(d.k % 2 == 1 && d.k <= 7 && w->numel == (size_t)d.C * d.k * d.k,
             "a depthwise weight is (C, 1, k, k), k odd, at most 7",
             "op %s: w has shape %s for %d channels", op, tensor_shape_str(w, buf, sizeof buf), d.C);
    d.p = d.k / 2;
    return d;
}

// MIRROR = false: y = b + sum_t w_t x(shift +t); true: dx += sum_t w_t dy(shift -t).
template <typename T, typename TW, bool MIRROR> struct DwTapsOp {
    const T *in;
    const TW *w, *bias;
    T *out;
    DwDims d;
    template <int V> __device__ void apply(size_t i) const {
        size_t c = i % d.C, pix = i / d.C;
        int wx = (int)(pix % d.W), h = (int)((pix / d.W) % d.H);
        size_t base = pix - (size_t)h * d.W - wx;   // (b, 0, 0)
        float acc = MIRROR ? 0.0f : (bias ? (float)bias[c] : 0.0f);
        for (int i2 = 0; i2 < d.k; i2++) {
            int hh = MIRROR ? h - i2 + d.p : h + i2 - d.p;
            if (hh < 0 || hh >= d.H) continue;
            for (int j = 0; j < d.k; j++) {
                int ww = MIRROR ? wx - j + d.p : wx + j - d.p;
                if (ww < 0 || ww >= d.W) continue;
                float v;
                load_v<1>(in + (base + (size_t)hh * d.W + ww) * d.C + c, &v);
                acc += (float)w[c * d.k * d.k + i2 * d.k + j] * v;
            }
        }
        if (MIRROR) {
            float prev;
            load_v<1>(out + i, &prev);
            acc += prev;
        }
        store_v<1>(out + i, &acc);
    }
};

// Column c * k * k + t of row `pixel`: dy[pixel, c] * x[pixel shifted by tap t, c].
template <typename T> struct DwWeightRows {
    const T *dy, *x;
    DwDims d;
    template <int V> __device__ void row(size_t r, size_t col, float *acc) const {
        int kk = d.k * d.k;
        int c = (int)(col / kk), t = (int)(col % kk), i = t / d.k, j = t % d.k;
        int wx = (int)(r % d.W), h = (int)((r / d.W) % d.H);
        int hh = h + i - d.p, ww = wx + j - d.p;
        if (hh < 0 || hh >= d.H || ww < 0 || ww >= d.W) return;
        size_t shifted = r + (size_t)(hh - h) * d.W + (ww - wx);
        float g, v;
        load_v<1>(dy + r * d.C + c, &g);
        load_v<1>(x + shifted * d.C + c, &v);
        acc[0] += g * v;
    }
};

void cuda_dwconv_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, Tensor *y) {
    const char *op = "dwconv_fwd";
    DwDims d = dw_dims(op, x, w);
    cuda_check_numel(op, "y", y, x->numel);
    cuda_check_same_dtype(op, "y", y, "x", x);
    if (b) {
        cuda_check_numel(op, "b", b, (size_t)d.C);
        cuda_check_same_dtype(op, "b", b, "w", w);
    }
    dispatch_dtype2(x->dtype, w->dtype, [&](auto tx, auto tw) {
        using T = TAG_T(tx);
        using TW = TAG_T(tw);
        launch_map(ctx, y->numel, false,
                   DwTapsOp<T, TW, false>{(const T *)x->data, (const TW *)w->data,
                                          b ? (const TW *)b->data : nullptr, (T *)y->data, d});
    });
}

void cuda_dwconv_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w, Tensor *dx,
                     Tensor *dw, Tensor *db) {
    const char *op = "dwconv_bwd";
    DwDims d = dw_dims(op, x, w);
    cuda_check_numel(op, "dy", dy, x->numel);
    cuda_check_same_dtype(op, "dy", dy, "x", x);
    size_t R = (size_t)d.B * d.H * d.W, kk = (size_t)d.k * d.k;
    if (dx) {
        cuda_check_numel(op, "dx", dx, x->numel);
        cuda_check_same_dtype(op, "dx", dx, "x", x);
        dispatch_dtype2(x->dtype, w->dtype, [&](auto tx, auto tw) {
            using T = TAG_T(tx);
            using TW = TAG_T(tw);
            launch_map(ctx, dx->numel, false,
                       DwTapsOp<T, TW, true>{(const T *)dy->data, (const TW *)w->data, nullptr,
                                             (T *)dx->data, d});
        });
    }
    if (dw) {
        cuda_check_f32(op, "dw", dw);
        cuda_check_numel(op, "dw", dw, (size_t)d.C * kk);
        dispatch_dtype(x->dtype, [&](auto tx) {
            using T = TAG_T(tx);
            launch_colsum(ctx, R, (size_t)d.C * kk, false,
                          DwWeightRows<T>{(const T *)dy->data, (const T *)x->data, d}, tensor_f32(dw));
        });
    }
    if (db) {
        cuda_check_f32(op, "db", db);
        cuda_check_numel(op, "db", db, (size_t)d.C);
        bool vec = d.C % 8 == 0 && aligned16(dy->data) && aligned16(db->data);
        dispatch_dtype(dy->dtype, [&](auto tx) {
            using T = TAG_T(tx);
            launch_colsum(ctx, R, (size_t)d.C, vec, ColsumRows<T>{(const T *)dy->data, (size_t)d.C},
                          tensor_f32(db));
        });
    }
}
