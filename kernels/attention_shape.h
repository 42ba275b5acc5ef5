// The shapes of attention_fwd / attention_bwd (kernels/ops_list.h) and their refusals, for both
// backends (kernels/cpu/attention.c, kernels/cuda/attention.cu): qkv (B, N, 3C), its last dim
// q | k | v, each (heads, D); N = numel / (B 3C), so a (B, H, W, 3C) grid works too. A backend adds
// its own device and dtype rules, and checks out and lse against the dims.
#pragma once
#include <math.h>
#include "tensor.h"
#include "error.h"

typedef struct AttnShape {
    int B, N, C, H, D;   // batch, tokens, channels, heads, head dim
    float scale;         // D^-0.5
} AttnShape;

static inline AttnShape attention_shape(const char *op, const Tensor *qkv, int heads) {
    char buf[64];
    CG_CHECK(qkv != NULL, "", "op %s: qkv is NULL", op);
    CG_CHECK(qkv->ndim >= 2 && tensor_last(qkv) % 3 == 0, "",
             "op %s: qkv has shape %s, expected (B, N, 3C)", op,
             tensor_shape_str(qkv, buf, sizeof buf));
    AttnShape s;
    s.B = qkv->shape[0];
    s.C = tensor_last(qkv) / 3;
    s.N = s.B && s.C ? (int)(qkv->numel / ((size_t)s.B * 3 * s.C)) : 0;
    s.H = heads;
    CG_CHECK(heads > 0 && s.C % heads == 0, "num_heads must divide the embedding width",
             "op %s: %d channels do not split into %d heads", op, s.C, heads);
    s.D = s.C / heads;
    s.scale = 1.0f / sqrtf((float)s.D);
    return s;
}
