// Resampling uint8 HWC images: a source rectangle (fractional pixel units) to an output size,
// separable, with the filter widened by the reduction factor when shrinking (antialiasing),
// as PIL's Image.resize(size, filter, box) does (torchvision antialias=True is the same).
// Taps that fall outside the image are dropped and the rest renormalized (PIL's edge rule).
// Intermediate values are kept in float (PIL rounds to uint8 between the passes), so results
// can differ from PIL's by 1 level.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum { RESIZE_BILINEAR = 0, RESIZE_BICUBIC = 1 } ResizeFilter;

// Grow-only work buffers; one per thread. Zero-initialize, free with resize_scratch_free.
typedef struct ResizeScratch {
    float *tmp;        // horizontal pass output
    float *wx, *wy;    // weights
    int *ix, *iy;      // first tap and tap count per output column / row (2 ints each)
    size_t tmp_cap, wx_cap, wy_cap, ix_cap, iy_cap;
} ResizeScratch;
void resize_scratch_free(ResizeScratch *s);

// dst (dh, dw, c) = the rectangle x in [x0, x0 + cw), y in [y0, y0 + ch) of src (sh, sw, c).
void resize_crop_u8(const uint8_t *src, int sh, int sw, int c, float x0, float y0, float cw,
                    float ch, uint8_t *dst, int dh, int dw, ResizeFilter filter,
                    ResizeScratch *s);
// Whole image to (dh, dw).
void resize_u8(const uint8_t *src, int sh, int sw, int c, uint8_t *dst, int dh, int dw,
               ResizeFilter filter, ResizeScratch *s);

// One float plane src (sh, sw) -> dst (dh, dw), the same separable antialiased filter as
// resize_u8 (PyTorch F.interpolate(mode='bilinear' | 'bicubic', align_corners=False,
// antialias=True) up to fp32 rounding; the bicubic is PIL's a = -0.5), nothing rounded or
// clamped. For images already normalized: the filter is linear, so normalizing first or last is
// the same. The resolution curriculum shows its teacher the student's image downscaled by it.
void resize_f32(const float *src, int sh, int sw, float *dst, int dh, int dw, ResizeFilter filter,
                ResizeScratch *s);
