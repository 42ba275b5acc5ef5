// The geometry of the patch embedding (kernels/ops_list.h patch_embed_fwd/bwd) and its checks,
// shared by the CPU and CUDA ops so both accept and refuse the same shapes: img (B, Cin, Hi, Wi)
// NCHW split into p x p patches, cols (B*H*W, Cin*p*p) with H = Hi/p, W = Wi/p, w (D, Cin*p*p)
// (or PyTorch's (D, Cin, p, p)). Each backend adds its dtype and device rules.
#pragma once
#include "tensor.h"
#include "error.h"

typedef struct PatchShape {
    int B, Cin, Hi, Wi, p, H, W, D;
    int K;      // Cin * p * p, columns of cols
    size_t R;   // B * H * W, rows of cols (tokens)
} PatchShape;

// The patches of img under w (img: the images, or their gradient).
static inline PatchShape patch_shape(const char *op, const Tensor *img, const Tensor *w, int patch) {
    char buf[64];
    CG_CHECK(img->ndim == 4, "images are NCHW at the op boundary",
             "op %s: img has shape %s, expected (B, Cin, H, W)", op,
             tensor_shape_str(img, buf, sizeof buf));
    PatchShape s = {img->shape[0], img->shape[1], img->shape[2], img->shape[3], patch, 0, 0, 0, 0, 0};
    CG_CHECK(patch > 0 && s.Hi % patch == 0 && s.Wi % patch == 0,
             "choose img_size a multiple of patch_size",
             "op %s: a %dx%d image does not split into %dx%d patches", op, s.Hi, s.Wi, patch, patch);
    s.H = s.Hi / patch;
    s.W = s.Wi / patch;
    s.K = s.Cin * patch * patch;
    s.R = (size_t)s.B * s.H * s.W;
    s.D = w->shape[0];
    CG_CHECK(w->numel == (size_t)s.D * s.K, "in_chans and patch_size must match the weight",
             "op %s: w has shape %s, expected (%d, %d) or (%d, %d, %d, %d) for %d input channels "
             "and patch %d", op, tensor_shape_str(w, buf, sizeof buf), s.D, s.K, s.D, s.Cin,
             patch, patch, s.Cin, patch);
    return s;
}

// The backward's cols and w: (R, K) and (D, K) with K a whole number of p x p patches.
static inline void patch_cols_check(const char *op, const Tensor *cols, const Tensor *w, int patch,
                                    size_t *R, int *K, int *D) {
    *D = w->shape[0];
    *K = tensor_last(cols);
    *R = tensor_rows(cols);
    CG_CHECK(patch > 0 && *K % (patch * patch) == 0 && w->numel == (size_t)*D * *K, "",
             "op %s: cols have %d columns and w %zu elements, not a patch %d embedding with %d "
             "outputs", op, *K, w->numel, patch, *D);
}

// dimg (NULL: not wanted) holds the images whose patches are the R x K cols.
static inline PatchShape patch_dimg_check(const char *op, const Tensor *dimg, const Tensor *w, int patch,
                                          size_t R, int K) {
    PatchShape s = patch_shape(op, dimg, w, patch);
    CG_CHECK(s.R == R && s.K == K, "", "op %s: dimg (%d images, %d channels, %dx%d) does not match "
             "cols of %zu tokens x %d", op, s.B, s.Cin, s.Hi, s.Wi, R, K);
    return s;
}
