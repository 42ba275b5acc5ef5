// CPU reference: patch embedding, a p x p stride-p convolution with bias (kernels/ops.h).
//   img (B,Cin,Hi,Wi) NCHW -> cols (B*H*W, Cin*p*p) -> y (B,H,W,D) = cols w^T + b
// with H = Hi/p, W = Wi/p; token (b,i,j) is row (b*H + i)*W + j of cols, and column
// ci*p*p + ky*p + kx holds img[b, ci, i*p + ky, j*p + kx], the order of PyTorch's (D,Cin,p,p)
// weight flattened to (D, Cin*p*p). The GEMM and the bias are cpu_linear's.
// Patches do not overlap (stride = kernel), so col2im in backward is a scatter, not a sum.
#include "../ops.h"
#include "cpu_check.h"
#include "gemm.h"

typedef struct PatchShape {
    int B, Cin, Hi, Wi, p, H, W, D;
    int K;       // Cin * p * p, columns of cols
    size_t R;    // B * H * W, rows of cols (tokens)
} PatchShape;

static PatchShape patch_shape(const char *op, const Tensor *img, const Tensor *w, int patch) {
    char buf[64];
    cpu_check_f32(op, "img", img);
    CG_CHECK(img->ndim == 4, "images are NCHW at the op boundary",
             "op %s: img has shape %s, expected (B, Cin, H, W)", op,
             tensor_shape_str(img, buf, sizeof buf));
    PatchShape s = {.B = img->shape[0], .Cin = img->shape[1], .Hi = img->shape[2],
                    .Wi = img->shape[3], .p = patch};
    CG_CHECK(patch > 0 && s.Hi % patch == 0 && s.Wi % patch == 0,
             "choose img_size a multiple of patch_size",
             "op %s: a %dx%d image does not split into %dx%d patches", op, s.Hi, s.Wi, patch, patch);
    s.H = s.Hi / patch;
    s.W = s.Wi / patch;
    s.K = s.Cin * patch * patch;
    s.R = (size_t)s.B * s.H * s.W;
    cpu_check_f32(op, "w", w);
    s.D = w->shape[0];
    CG_CHECK(w->numel == (size_t)s.D * s.K, "in_chans and patch_size must match the weight",
             "op %s: w has shape %s, expected (%d, %d) or (%d, %d, %d, %d) for %d input channels "
             "and patch %d", op, tensor_shape_str(w, buf, sizeof buf), s.D, s.K, s.D, s.Cin,
             patch, patch, s.Cin, patch);
    return s;
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
    PatchShape s = patch_shape("patch_embed_fwd", img, w, patch);
    cpu_check_matrix("patch_embed_fwd", "cols", cols, s.R, s.K);
    cpu_check_matrix("patch_embed_fwd", "y", y, s.R, s.D);
    patch_im2col(&s, tensor_f32(img), tensor_f32(cols));
    Tensor w2 = tensor_view(w, 2, (int[]){s.D, s.K});
    Tensor c2 = tensor_view(cols, 2, (int[]){(int)s.R, s.K});
    Tensor y2 = tensor_view(y, 2, (int[]){(int)s.R, s.D});
    cpu_linear_fwd(ctx, &c2, &w2, b, &y2);
}

// dw += dy^T cols; db += sum over tokens of dy; dimg += col2im(dy w).
void cpu_patch_embed_bwd(Ctx *ctx, const Tensor *dy, const Tensor *cols, const Tensor *w,
                         int patch, Tensor *dimg, Tensor *dw, Tensor *db) {
    cpu_check_f32("patch_embed_bwd", "w", w);
    cpu_check_f32("patch_embed_bwd", "cols", cols);
    int D = w->shape[0], K = tensor_last(cols);
    size_t R = tensor_rows(cols);
    CG_CHECK(patch > 0 && K % (patch * patch) == 0 && w->numel == (size_t)D * K, "",
             "op patch_embed_bwd: cols have %d columns and w %zu elements, not a patch %d "
             "embedding with %d outputs", K, w->numel, patch, D);
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
        cpu_linear_bwd(ctx, &dy2, &c2, &w2, NULL, dw ? &dw2 : NULL, db);
    }
    if (dimg) {
        PatchShape s = patch_shape("patch_embed_bwd", dimg, w, patch);
        CG_CHECK(s.R == R && s.K == K, "", "op patch_embed_bwd: dimg (%d images, %d channels, "
                 "%dx%d) does not match cols of %zu tokens x %d", s.B, s.Cin, s.Hi, s.Wi, R, K);
        float *dcols = cg_malloc(sizeof(float) * R * K);   // dcols = dy w, (R, K)
        cpu_sgemm(0, 0, (int)R, K, D, 1.0f, tensor_f32(dy), D, tensor_f32(w), K, 0.0f, dcols, K);
        patch_col2im_add(&s, dcols, tensor_f32(dimg));
        free(dcols);
    }
}
