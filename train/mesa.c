#include "mesa.h"

bool mesa_active(const Mesa *m, int64_t epoch) {
    return m->weight > 0.0f && epoch >= m->start_epoch;
}

Tensor *mesa_loss_from_logits(Tape *t, const Mesa *m, Tensor *teacher, Tensor *s) {
    float T = m->temperature;
    bool was = tape_set_grad_enabled(t, false);
    Tensor *ts = nn_scale(t, teacher, 1.0f / T);
    tape_set_grad_enabled(t, was);
    // token_kl(a, b) = mean over rows of KL(P(a) || P(b)): the teacher first, the student second
    Tensor *kl = nn_token_kl(t, ts, nn_scale(t, s, 1.0f / T));
    return nn_scale(t, kl, m->weight * T * T);
}

Tensor *mesa_loss(Tape *t, const Mesa *m, const Encoder *ema, Tensor *x, Tensor *s) {
    bool was = tape_set_grad_enabled(t, false);
    Tensor *teacher = encoder_head(t, ema, encoder_forward(t, ema, x, NULL));
    tape_set_grad_enabled(t, was);
    return mesa_loss_from_logits(t, m, teacher, s);
}
