// MESA (Du et al. 2022, "Sharpness-Aware Training for Free", memory-efficient variant): the
// trajectory loss with the EMA of the weights as the past model. For a batch x, student logits
// s = f_theta(x) and the EMA model's t = f_ema(x) (no gradient, no drop path):
//   L_mesa = lambda * T^2 * mean over the batch of KL(softmax(t/T) || softmax(s/T))
// added to the classification loss from epoch mesa_start_epoch on (the authors' code:
// F.kl_div(log_softmax(s/T), softmax(t/T)).sum(-1).mean() * T^2, weight "reinforce").
#pragma once
#include "../nn/encoder.h"

typedef struct Mesa {
    float weight, temperature;
    int start_epoch;
} Mesa;

// Whether the term is on for a step of this epoch (0-based).
bool mesa_active(const Mesa *m, int64_t epoch);
// L_mesa (1) for student logits s (B,K) and the EMA encoder on the same images x; the gradient
// reaches s only.
Tensor *mesa_loss(Tape *t, const Mesa *m, const Encoder *ema, Tensor *x, Tensor *s);
// The term alone from given teacher logits (B,K) (no gradient to them): mesa_loss's arithmetic.
Tensor *mesa_loss_from_logits(Tape *t, const Mesa *m, Tensor *teacher, Tensor *s);
