// Host-side resampling of a learned position-embedding grid, as timm's resample_abs_pos_embed
// does it: F.interpolate(mode='bicubic', align_corners=False, antialias=True). With antialias
// PyTorch takes its separable anti-aliased path in both directions: a bicubic filter with
// a = -0.5 (PIL's), stretched by the scale when shrinking, weights normalized over the part
// of the window inside the image.
#pragma once

// src (sh, sw, C) -> dst (dh, dw, C), channels-last.
void resample_bicubic_aa(const float *src, int sh, int sw, float *dst, int dh, int dw, int C);
