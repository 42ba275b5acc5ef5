#include "adaptor.h"
#include "../kernels/error.h"

void adaptor_register(Adaptor *a, ParamTable *t, const char *prefix, int width, int out_width,
                      int hidden, GeluKind gelu) {
    CG_CHECK(hidden > 0, "set adaptor_hidden >= 1 (0 = the model width)", "adaptor hidden width %d",
             hidden);
    char name[PARAM_NAME_MAX];
    snprintf(name, sizeof name, "%s.fc1", prefix);
    linear_register(&a->fc1, t, name, width, hidden, true, 0.02f);
    snprintf(name, sizeof name, "%s.fc2.weight", prefix);
    a->residual = width == out_width;
    a->fc2.w = params_add(t, name, 2, (int[]){out_width, hidden},
                          a->residual ? INIT_ZEROS : INIT_TRUNC_NORMAL, 0.02f, true);
    snprintf(name, sizeof name, "%s.fc2.bias", prefix);
    a->fc2.b = params_add(t, name, 1, (int[]){out_width}, INIT_ZEROS, 0, false);
    a->gelu = gelu;
}

Tensor *adaptor_forward(Tape *t, const Adaptor *a, Tensor *v) {
    Tensor *h = nn_mlp(t, nn_cast(t, v, t->ctx->act_dtype), a->fc1.w, a->fc1.b, a->fc2.w, a->fc2.b,
                       a->gelu, false);
    if (!a->residual) return nn_cast(t, h, v->dtype);   // (..., out_width)
    return nn_add(t, v, h);   // (..., width), v's dtype
}
