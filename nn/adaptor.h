// Stage 2 feature adaptor (docs/design.md#stage2): A(v) = v + W2 gelu(W1 v + b1) + b2, a residual 2-layer
// MLP inserted before a distillation tap. W2 and b2 start at zero, so A starts as the identity.
// When the teacher's width differs from the student's (a second teacher, a summary of another
// width), A(v) = W2 gelu(W1 v + b1) + b2 maps width -> out_width, W2 drawn like W1 (a zero W2
// would give W1 no gradient at the first step).
// Parameters (timm-style names under the given prefix, e.g. "adaptors.8.pp"):
//   PREFIX.fc1.weight (hidden, width), PREFIX.fc1.bias (hidden)            trunc_normal(0.02), zeros
//   PREFIX.fc2.weight (out_width, hidden), PREFIX.fc2.bias (out_width)     zeros (or trunc_normal(0.02)), zeros
#pragma once
#include "layers.h"

typedef struct Adaptor {
    Linear fc1, fc2;
    GeluKind gelu;
    bool residual;       // width == out_width
} Adaptor;

void adaptor_register(Adaptor *a, ParamTable *t, const char *prefix, int width, int out_width,
                      int hidden, GeluKind gelu);
// v (..., width), any dtype -> A(v) (..., out_width) in v's dtype (the MLP branch runs in the
// activation dtype, the residual add in v's, so an fp32 residual-stream tap stays fp32).
Tensor *adaptor_forward(Tape *t, const Adaptor *a, Tensor *v);
