// The parameter table: every parameter's metadata (timm-style name, shape, trainable,
// weight decay, init rule) and four persistent buffers, one allocation each: values,
// gradients, AdamW first and second moments (plus fp32 master weights when the values are
// bf16). Layers keep Tensor pointers into the table. Values are in the context's activation
// dtype; gradients, moments and masters are fp32 (kernels/ops.h, precision rules).
//
// Kept fp32 (params_keep_f32): in a bf16 table, a parameter that no GEMM or convolution reads
// (LayerNorm weights and biases, the propagation's merge weights) has fp32 values: the master
// itself, as PyTorch's autocast leaves such parameters unrounded. Its slot in the bf16 values
// buffer is unused. When ZeRO shards the masters, these values move to a small whole buffer of
// their own (values_f32), which every step's all-gather completes (dist/grads.h).
//
// The optimizer state (m, v, masters) has one of two layouts:
//   whole    (params_alloc) laid out as the values: parameter p at p->offset; p->m, p->v and
//            p->master are views of it.
//   shard    (params_shard_state, ZeRO-1 across ranks) only the pieces of a rank's shard: piece
//            s (elements [start, start + len) of one parameter) at element `at` of each buffer,
//            the pieces in table order at running offsets rounded up to PARAM_ALIGN. p->m, p->v
//            and p->master keep their shapes but have no data.
// params_state_view is the one way to reach a range of the state in either layout.
#pragma once
#include "../kernels/tensor.h"
#include "../kernels/rng.h"
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
#define PARAM_ALIGN 64   // elements: keeps every parameter (and shard piece) 256-byte aligned

// Elements [start, start + len) of parameter `param` (its table index); `at`: where the piece
// lives in a sharded table's state buffers (set by params_shard_state).
typedef struct ParamSegment {
    int param;
    size_t start, len;
    size_t at;
} ParamSegment;

typedef enum { PARAM_STATE_M, PARAM_STATE_V, PARAM_STATE_MASTER } ParamState;

typedef struct Param {
    char name[PARAM_NAME_MAX];
    Tensor value;        // value.grad == &grad
    Tensor grad;
    Tensor m, v;         // AdamW moments, fp32 (data NULL when the table's state is sharded)
    Tensor master;       // fp32 master weights when values are bf16 (master.data NULL otherwise,
                         // and in a sharded table: ParamTable.masters says whether there are any)
    bool trainable;
    bool decay;          // weight decay applies (not to biases, norms, 1-D params, tokens)
    bool keep_f32;       // fp32 values in a bf16 table (params_keep_f32)
    ParamInit init;
    float init_arg;
    size_t offset;       // elements from the start of each buffer
    size_t offset_f32;   // elements from the start of values_f32 (a sharded table's kept fp32)
} Param;

typedef struct ParamTable {
    Param **params;
    int n, cap;
    size_t total;        // elements, including alignment padding
    Device device;
    DType dtype;         // of the values
    void *values, *grads, *m, *v, *masters;   // masters NULL when dtype is fp32
    size_t state_total;  // elements of each of m, v, masters (total, or the shard's when sharded)
    ParamSegment *shard; // NULL: whole state; else the pieces kept (params_shard_state)
    int n_shard;
    // A sharded bf16 table's kept-fp32 values (the parameters in table order, each at its
    // offset_f32, padded to PARAM_ALIGN): total_f32 elements, or NULL when it has none.
    void *values_f32;
    size_t total_f32;
    // Runs of parameters with equal weight decay over the whole buffers, on the device, for one
    // AdamW launch over the table (kernels/ops.h AdamWArgs); params_decay_runs builds them.
    int n_decay_runs;
    uint64_t *decay_ends;
    uint8_t *decay_on;
} ParamTable;

void params_init_table(ParamTable *t);
// Registers a parameter (before params_alloc). Returns its value tensor (data bound later).
Tensor *params_add(ParamTable *t, const char *name, int ndim, const int *shape, ParamInit init,
                   float init_arg, bool decay);
// Allocates the buffers on ctx's device (values in ctx->act_dtype) and binds every tensor.
void params_alloc(ParamTable *t, Ctx *ctx);
// Marks a registered parameter (value as params_add returned it) to keep fp32 values in a bf16
// table (the header's comment). Before params_alloc; a frozen table ignores it.
void params_keep_f32(ParamTable *t, Tensor *value);
// A frozen table (a teacher): values only, no gradients, moments or masters (a quarter of the
// memory, or less); every parameter is marked not trainable. Values in ctx->act_dtype (bf16 on
// the GPU). params_set_trainable must not make such a table trainable.
void params_alloc_frozen(ParamTable *t, Ctx *ctx);
// Fills every parameter by its init rule; each parameter draws from its own stream of
// (seed, name), so adding a parameter does not change the others' values.
void params_initialize(ParamTable *t, Ctx *ctx, uint64_t seed);
// Writes fp32 host values into parameter i (and its master copy, the part the table keeps).
void params_set_value(ParamTable *t, int i, Ctx *ctx, const float *host);
// Keeps only the optimizer state of seg (n pieces in table order, each inside one parameter,
// not overlapping; `at` is ignored and assigned): allocates shard-size m, v and masters, copies
// the pieces' current state into them and frees the whole-size buffers. Called once, before the
// first step (dist_grads_create does, with zero = 1 across ranks); a second call with the same
// pieces does nothing, with other pieces it stops with a message.
void params_shard_state(ParamTable *t, Ctx *ctx, const ParamSegment *seg, int n);
// A 1-D fp32 view of elements [start, start + len) of parameter `param`'s m, v or master, in
// either layout. Sharded: the range must lie inside one piece of the shard.
Tensor params_state_view(const ParamTable *t, ParamState kind, int param, size_t start, size_t len);
// Writes a whole parameter's state from host fp32 (numel values): every element in the whole
// layout, the shard's pieces of it when sharded (the rest is not this table's to keep).
void params_upload_state(ParamTable *t, Ctx *ctx, ParamState kind, int param, const float *host);
// Bytes of one kind of optimizer state the table holds on its device (0 when it holds none).
size_t params_state_bytes(const ParamTable *t, ParamState kind);
void params_zero_grads(ParamTable *t, Ctx *ctx);
// Builds the table's decay runs (once; params_alloc must have run): consecutive parameters with
// the same decay flag form one run, which ends where the next run's first parameter starts (its
// padding included) or at `total`.
void params_decay_runs(ParamTable *t, Ctx *ctx);
void params_zero_moments(ParamTable *t, Ctx *ctx);
// Zeroes a sharded table's kept-fp32 values (values_f32; nothing when it has none): the ZeRO step
// then writes its shard's pieces and the ranks' buffers are summed (dist_gather_values).
void params_zero_kept_f32(ParamTable *t, Ctx *ctx);
void params_free(ParamTable *t, Ctx *ctx);
Param *params_find(const ParamTable *t, const char *name);
size_t params_count(const ParamTable *t, bool trainable_only);
// Marks parameters whose name starts with prefix (NULL = all) trainable or frozen.
void params_set_trainable(ParamTable *t, const char *prefix, bool trainable);
