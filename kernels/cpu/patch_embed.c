// CPU reference: patch embedding, a p x p stride-p convolution with bias (kernels/ops.h).
//   img (B,Cin,Hi,Wi) NCHW -> cols (B*H*W, Cin*p*p) -> y (B,H,W,D) = cols w^T + b
// with H = Hi/p, W = Wi/p; token (b,i,j) is row (b*H + i)*W + j of cols, and column
// ci*p*p + ky*p + kx holds img[b, ci, i*p + ky, j*p + kx], the order of PyTorch's (D,Cin,p,p)
// weight flattened to (D, Cin*p*p). The GEMM and the bias are cpu_linear's.
// Patches do not overlap (stride = kernel), so col2im in backward is a scatter, not a sum.
#include "../ops.h"
#include "cpu_check.h"
#include "../patch_embed_shape.h"
#include "gemm.h"

// The shared geometry and checks (kernels/patch_embed_shape.h), then the CPU's rule: fp32 on the host.
static PatchShape cpu_patch_shape(const char *op, const Tensor *img, const Tensor *w, int patch) {
    cpu_check_f32(op, "img", img);
    cpu_check_f32(op, "w", w);
    return patch_shape(op, img, w, patch);
}

// cols[(b*H + i)*W + j][ci*p*p + ky*p + kx] = img[b][ci][i*p + ky][j*p + kx]
static void patch_im2col(const PatchShape *s, const float *img, float *cols) {
    int p = s->p;
    #pragma omp parallel for schedule(static)
    for (size_t r = 0; r < s->R; r++) {
        int j = (int)(r % s->W), i = (int)(r / s->W % s->H), b = (int)(r / ((size_t)s->W * s->H));
        float *row = cols + r * s->K;
        for (int ci = 0; ci < s->Cin; ci++)
            for (int ky = 0; ky < p; ky++) {
                const float *src = img + (((size_t)b * s->Cin + ci) * s->Hi + i * p + ky) * s->Wi + j * p;
                memcpy(row + (ci * p + ky) * p, src, (size_t)p * sizeof(float));
            }
    }
}

// img[b][ci][i*p + ky][j*p + kx] += cols[(b*H + i)*W + j][ci*p*p + ky*p + kx]
static void patch_col2im_add(const PatchShape *s, const float *cols, float *img) {
    int p = s->p;
    #pragma omp parallel for schedule(static)
    for (size_t r = 0; r < s->R; r++) {   // each image pixel belongs to exactly one row r
        int j = (int)(r % s->W), i = (int)(r / s->W % s->H), b = (int)(r / ((size_t)s->W * s->H));
        const float *row = cols + r * s->K;
        for (int ci = 0; ci < s->Cin; ci++)
            for (int ky = 0; ky < p; ky++) {
                float *dst = img + (((size_t)b * s->Cin + ci) * s->Hi + i * p + ky) * s->Wi + j * p;
                const float *src = row + (ci * p + ky) * p;
                for (int kx = 0; kx < p; kx++) dst[kx] += src[kx];
            }
    }
}

void cpu_patch_embed_fwd(Ctx *ctx, const Tensor *img, const Tensor *w, const Tensor *b,
                         int patch, Tensor *cols, Tensor *y) {
    PatchShape s = cpu_patch_shape("patch_embed_fwd", img, w, patch);
    cpu_check_matrix("patch_embed_fwd", "cols", cols, s.R, s.K);
    cpu_check_matrix("patch_embed_fwd", "y", y, s.R, s.D);
    patch_im2col(&s, tensor_f32(img), tensor_f32(cols));
    Tensor w2 = tensor_view(w, 2, (int[]){s.D, s.K});
    Tensor c2 = tensor_view(cols, 2, (int[]){(int)s.R, s.K});
    Tensor y2 = tensor_view(y, 2, (int[]){(int)s.R, s.D});
    cpu_linear_fwd(ctx, &c2, &w2, b, NULL, &y2);
}

// dw += dy^T cols; db += sum over tokens of dy; dimg += col2im(dy w).
void cpu_patch_embed_bwd(Ctx *ctx, const Tensor *dy, const Tensor *cols, const Tensor *w,
                         int patch, Tensor *dimg, Tensor *dw, Tensor *db) {
    cpu_check_f32("patch_embed_bwd", "w", w);
    cpu_check_f32("patch_embed_bwd", "cols", cols);
    int D, K;
    size_t R;
    patch_cols_check("patch_embed_bwd", cols, w, patch, &R, &K, &D);
    cpu_check_matrix("patch_embed_bwd", "dy", dy, R, D);
    Tensor w2 = tensor_view(w, 2, (int[]){D, K});
    Tensor c2 = tensor_view(cols, 2, (int[]){(int)R, K});
    Tensor dy2 = tensor_view(dy, 2, (int[]){(int)R, D});
    if (dw || db) {
        Tensor dw2;
        if (dw) {
            cpu_check_numel("patch_embed_bwd", "dw", dw, w->numel);
            dw2 = tensor_view(dw, 2, (int[]){D, K});
        }
        cpu_linear_bwd(ctx, &dy2, &c2, &w2, 0, NULL, NULL, dw ? &dw2 : NULL, db);
    }
    if (dimg) {
        cpu_check_f32("patch_embed_bwd", "dimg", dimg);
        PatchShape s = patch_dimg_check("patch_embed_bwd", dimg, w, patch, R, K);
        float *dcols = cg_malloc(sizeof(float) * R * K);   // dcols = dy w, (R, K)
        cpu_sgemm(0, 0, (int)R, K, D, 1.0f, tensor_f32(dy), D, tensor_f32(w), K, 0.0f, dcols, K);
        patch_col2im_add(&s, dcols, tensor_f32(dimg));
        free(dcols);
    }
}
