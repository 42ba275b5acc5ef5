// The parameter table: every parameter's metadata (timm-style name, shape, trainable,
// weight decay, init rule) and four persistent buffers, one allocation each: values,
// gradients, AdamW first and second moments (plus fp32 master weights when the values are
// bf16). Layers keep Tensor pointers into the table. Values are in the context's activation
// dtype; gradients, moments and masters are fp32 (kernels/ops.h, precision rules).
#pragma once
#include "tensor.h"
#include "rng.h"
#include "../kernels/ctx.h"

typedef enum {
    INIT_ZEROS,
    INIT_ONES,
    INIT_CONST,          // init_arg
    INIT_TRUNC_NORMAL,   // std = init_arg (timm ViT: 0.02 for Linear weights and tokens)
    INIT_FAN_IN_UNIFORM, // U(-1/sqrt(fan_in), 1/sqrt(fan_in)), PyTorch's Conv/Linear bias rule
    INIT_XAVIER_UNIFORM, // U(-a, a), a = sqrt(6/(fan_in+fan_out)), shape (out, in...)
} ParamInit;

#define PARAM_NAME_MAX 128

typedef struct Param {
    char name[PARAM_NAME_MAX];
    Tensor value;        // value.grad == &grad
    Tensor grad;
    Tensor m, v;         // AdamW moments, fp32
    Tensor master;       // fp32 master weights when values are bf16 (master.data NULL otherwise)
    bool trainable;
    bool decay;          // weight decay applies (not to biases, norms, 1-D params, tokens)
    ParamInit init;
    float init_arg;
    size_t offset;       // elements from the start of each buffer
} Param;

typedef struct ParamTable {
    Param **params;
    int n, cap;
    size_t total;        // elements, including alignment padding
    Device device;
    DType dtype;         // of the values
    void *values, *grads, *m, *v, *masters;   // masters NULL when dtype is fp32
} ParamTable;

void params_init_table(ParamTable *t);
// Registers a parameter (before params_alloc). Returns its value tensor (data bound later).
Tensor *params_add(ParamTable *t, const char *name, int ndim, const int *shape, ParamInit init,
                   float init_arg, bool decay);
// Allocates the buffers on ctx's device (values in ctx->act_dtype) and binds every tensor.
void params_alloc(ParamTable *t, Ctx *ctx);
// A frozen table (a teacher): values only, no gradients, moments or masters (a quarter of the
// memory, or less); every parameter is marked not trainable. Values in ctx->act_dtype (bf16 on
// the GPU). params_set_trainable must not make such a table trainable.
void params_alloc_frozen(ParamTable *t, Ctx *ctx);
// Fills every parameter by its init rule; each parameter draws from its own stream of
// (seed, name), so adding a parameter does not change the others' values.
void params_initialize(ParamTable *t, Ctx *ctx, uint64_t seed);
// Writes fp32 host values into a parameter (and its master copy).
void params_set_value(Param *p, Ctx *ctx, const float *host);
void params_zero_grads(ParamTable *t, Ctx *ctx);
void params_zero_moments(ParamTable *t, Ctx *ctx);
void params_free(ParamTable *t, Ctx *ctx);
Param *params_find(const ParamTable *t, const char *name);
size_t params_count(const ParamTable *t, bool trainable_only);
// Marks parameters whose name starts with prefix (NULL = all) trainable or frozen.
void params_set_trainable(ParamTable *t, const char *prefix, bool trainable);
