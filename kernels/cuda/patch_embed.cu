// CUDA patch embedding (kernels/ops.h; kernels/cpu/patch_embed.c is the reference): a p x p
// stride-p convolution with bias as im2col + the linear GEMM.
//   img (B,Cin,Hi,Wi) NCHW, act dtype or fp32 -> cols (B*H*W, Cin*p*p) act dtype
//   -> y (B,H,W,D) = cols w^T + b        (cuda_linear_fwd: bias fused in the GEMM)
// Token (b,i,j) is row (b*H + i)*W + j; column ci*p*p + ky*p + kx holds img[b,ci,i*p+ky,j*p+kx],
// PyTorch's (D,Cin,p,p) weight order.
// Backward: dw, db through cuda_linear_bwd (db fused in the dw GEMM); dimg += col2im(dy w), with
// dcols = dy w computed in fp32 and scattered by one thread per image pixel: patches do not
// overlap, so every pixel reads exactly one dcols element (deterministic, no atomics).
#include "cuda_gemm.h"
#include "../ops.h"
#include "../patch_embed_shape.h"
#include <limits.h>

// The shared geometry and checks (kernels/patch_embed_shape.h), then the CUDA op's rules: both
// on the GPU, tokens within int range.
static PatchShape cuda_patch_shape(const char *op, const Tensor *img, const Tensor *w, int patch) {
    cuda_check_tensor(op, "img", img);
    cuda_check_tensor(op, "w", w);
    PatchShape s = patch_shape(op, img, w, patch);
    CG_CHECK(s.R <= INT_MAX, "reduce batch_size", "op %s: %zu tokens exceed int range", op, s.R);
    return s;
}

// cols[r][ci*p*p + ky*p + kx] = img[b][ci][i*p + ky][j*p + kx], r = (b*H + i)*W + j; one thread
// per cols element (consecutive threads: consecutive kx, contiguous in both).
template <typename TI, typename TO>
__global__ void im2col_kernel(const TI *img, TO *cols, PatchShape s) {
    size_t n = s.R * (size_t)s.K;
    int pp = s.p * s.p;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        size_t r = idx / s.K;
        int col = (int)(idx - r * s.K);
        int ci = col / pp, ky = col % pp / s.p, kx = col % s.p;
        int j = (int)(r % s.W), i = (int)(r / s.W % s.H);
        size_t b = r / ((size_t)s.W * s.H);
        size_t src = ((b * s.Cin + ci) * s.Hi + (size_t)i * s.p + ky) * s.Wi + (size_t)j * s.p + kx;
        cols[idx] = cuda_from_f32<TO>(cuda_to_f32(img[src]));
    }
}

// dimg[b][ci][y][x] += dcols[r][ci*p*p + (y%p)*p + x%p], r = (b*H + y/p)*W + x/p; one thread per
// pixel, so each output is written by exactly one thread.
template <typename T>
__global__ void col2im_add_kernel(const float *dcols, T *dimg, PatchShape s) {
    size_t n = (size_t)s.B * s.Cin * s.Hi * s.Wi;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int x = (int)(idx % s.Wi), y = (int)(idx / s.Wi % s.Hi), ci = (int)(idx / ((size_t)s.Wi * s.Hi) % s.Cin);
        size_t b = idx / ((size_t)s.Wi * s.Hi * s.Cin);
        size_t r = (b * s.H + y / s.p) * s.W + x / s.p;
        int col = (ci * s.p + y % s.p) * s.p + x % s.p;
        dimg[idx] = cuda_from_f32<T>(cuda_to_f32(dimg[idx]) + dcols[r * s.K + col]);
    }
}

template <typename TI>
static void launch_im2col(Ctx *ctx, const TI *img, void *cols, DType act, const PatchShape *s) {
    size_t n = s->R * (size_t)s->K;
    cudaStream_t st = cuda_stream_of(ctx);
    if (act == DTYPE_BF16)
        im2col_kernel<<<cuda_grid_for(ctx, n), 256, 0, st>>>(img, (__nv_bfloat16 *)cols, *s);
    else
        im2col_kernel<<<cuda_grid_for(ctx, n), 256, 0, st>>>(img, (float *)cols, *s);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_patch_embed_fwd(Ctx *ctx, const Tensor *img, const Tensor *w, const Tensor *b,
                                     int patch, Tensor *cols, Tensor *y) {
    PatchShape s = cuda_patch_shape("patch_embed_fwd", img, w, patch);
    DType act = w->dtype;
    CG_CHECK(img->dtype == act || img->dtype == DTYPE_F32, "",
             "op patch_embed_fwd: img is %s, expected %s or fp32", dtype_name(img->dtype),
             dtype_name(act));
    cuda_check_matrix("patch_embed_fwd", "cols", cols, s.R, s.K);
    cuda_check_dtype("patch_embed_fwd", "cols", cols, act);
    cuda_check_matrix("patch_embed_fwd", "y", y, s.R, s.D);
    if (s.R == 0) return;
    if (img->dtype == DTYPE_BF16)
        launch_im2col(ctx, (const __nv_bfloat16 *)img->data, cols->data, act, &s);
    else
        launch_im2col(ctx, (const float *)img->data, cols->data, act, &s);
    int wshape[2] = {s.D, s.K}, cshape[2] = {(int)s.R, s.K}, yshape[2] = {(int)s.R, s.D};
    Tensor w2 = tensor_view(w, 2, wshape);
    Tensor c2 = tensor_view(cols, 2, cshape);
    Tensor y2 = tensor_view(y, 2, yshape);
    cuda_linear_fwd(ctx, &c2, &w2, b, NULL, &y2);
}

// dw += dy^T cols; db += sum over tokens of dy; dimg += col2im(dy w).
extern "C" void cuda_patch_embed_bwd(Ctx *ctx, const Tensor *dy, const Tensor *cols, const Tensor *w,
                                     int patch, Tensor *dimg, Tensor *dw, Tensor *db) {
    cuda_check_tensor("patch_embed_bwd", "w", w);
    cuda_check_dtype("patch_embed_bwd", "cols", cols, w->dtype);
    int D, K;
    size_t R;
    patch_cols_check("patch_embed_bwd", cols, w, patch, &R, &K, &D);
    CG_CHECK(R <= INT_MAX, "reduce batch_size", "op patch_embed_bwd: %zu tokens exceed int range", R);
    cuda_check_matrix("patch_embed_bwd", "dy", dy, R, D);
    cuda_check_dtype("patch_embed_bwd", "dy", dy, w->dtype);
    int wshape[2] = {D, K}, cshape[2] = {(int)R, K}, dyshape[2] = {(int)R, D};
    Tensor w2 = tensor_view(w, 2, wshape);
    Tensor c2 = tensor_view(cols, 2, cshape);
    Tensor dy2 = tensor_view(dy, 2, dyshape);
    if (dw || db) {
        Tensor dw2;
        if (dw) {
            CG_CHECK(dw->numel == w->numel, "", "op patch_embed_bwd: dw has %zu elements, w %zu",
                     dw->numel, w->numel);
            dw2 = tensor_view(dw, 2, wshape);
        }
        cuda_linear_bwd(ctx, &dy2, &c2, &w2, 0, NULL, NULL, dw ? &dw2 : NULL, db);
    }
    if (!dimg || R == 0) return;
    cuda_check_tensor("patch_embed_bwd", "dimg", dimg);
    PatchShape s = patch_dimg_check("patch_embed_bwd", dimg, w, patch, R, K);
    CG_CHECK(dimg->dtype == w->dtype || dimg->dtype == DTYPE_F32, "",
             "op patch_embed_bwd: dimg is %s, expected %s or fp32", dtype_name(dimg->dtype),
             dtype_name(w->dtype));

    // dcols^T (K,R) = w^T (K,D) dy^T (D,R), fp32 (cuBLASLt column-major, as in linear.cu's dx).
    cudaStream_t st = cuda_stream_of(ctx);
    float *dcols = NULL;
    CUDA_CHECK(cudaMallocAsync((void **)&dcols, R * (size_t)K * sizeof(float), st));
    CudaGemm g;
    memset(&g, 0, sizeof g);
    cudaDataType_t t = cuda_dtype_of(w->dtype);
    g.m = K; g.n = (int)R; g.k = D;
    g.a = w->data; g.lda = K; g.a_type = t;
    g.b = dy->data; g.ldb = D; g.b_type = t;
    g.d = dcols; g.ldd = K; g.d_type = CUDA_R_32F;
    cuda_gemm(ctx, &g, "patch_embed_bwd dcols");
    size_t n = dimg->numel;
    if (dimg->dtype == DTYPE_BF16)
        col2im_add_kernel<<<cuda_grid_for(ctx, n), 256, 0, st>>>(dcols, (__nv_bfloat16 *)dimg->data, s);
    else
        col2im_add_kernel<<<cuda_grid_for(ctx, n), 256, 0, st>>>(dcols, (float *)dimg->data, s);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaFreeAsync(dcols, st));
}
