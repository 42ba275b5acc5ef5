// The ops. Each op is one entry of kernels/ops_list.h (its contract and signature), declared here
// three times (op_*, cpu_*, cuda_*); kernels/cpu/*.c and kernels/cuda/*.cu implement it with the
// same signature, and kernels/dispatch.c routes op_* to the backend the tensors live on, both
// from that one list. Layers (nn/) call only op_*.
//
// Conventions
// - Tokens are channels-last: (B,H,W,C) is also a (B*H*W, C) matrix; ops that only need rows
//   and a last dim read them from the tensor (rows = numel / last dim).
// - Backward functions ACCUMULATE (+=) into every gradient they are given; a NULL gradient
//   means "not needed" and is skipped. The tape zeroes activation gradients when it creates
//   them and the optimizer zeroes parameter gradients, so fan-out (residuals) just works.
// - Scalars that come back to the host (losses, norms) are written to 1-element fp32 tensors.
// - Precision: activations and their gradients are in ctx->act_dtype (fp32 on the CPU; bf16 or
//   fp32 on the GPU), except the encoders' residual stream, kept in fp32; parameters are in
//   act_dtype too, with fp32 master copies when that is bf16, except those no GEMM or
//   convolution reads (LayerNorm's, the scan's merge weights), which stay fp32 (nn/params.h);
//   parameter gradients, optimizer moments, LayerNorm statistics and losses are fp32.
//   An op accepts any mix that follows these rules (e.g. linear_bwd: bf16 dy, x, w; fp32 dw).
// - A fusion of an op with its neighbours is an option of that op (a flag, or an options struct
//   below), not an op of its own: the backend picks the fused kernel where it has one.
#pragma once
#include "ctx.h"
#include "device.h"   // memory and copies: every op user needs them

#ifdef __cplusplus
extern "C" {
#endif

// ---- argument types -----------------------------------------------------------------------
typedef enum { GELU_ERF = 0, GELU_TANH = 1 } GeluKind;
// dwconv_fwd and dwconv_bwd flags (their entries say what each does).
enum { DWCONV_RESIDUAL = 1, DWCONV_WRITE_DX = 2, DWCONV_SILU = 4 };
// dwconv_silu_proj_fwd's widest projection (its entry).
enum { DWCONV_PROJ_MAX = 4 };
// conv2d_bwd's flags (its entry).
enum { CONV2D_WRITE_DX = 1 };
// The write modes of linear_bwd, attention_bwd and gspn_scan_bwd (their entries): the input
// gradients written rather than added into, where nothing has written them yet.
enum { LINEAR_WRITE_DX = 1 };
enum { ATTENTION_WRITE_DQKV = 1 };
enum { GSPN_SCAN_WRITE_GRADS = 1 };
// linear_fwd's fusions (its entry has the contract of each): NULL, or all zero, is a plain
// linear. At most one of silu_in, gelu_out and res: no kernel fuses two (refused by name).
typedef struct LinearFwdOpts {
    int silu_in;          // y = silu(x) w^T + b: SiLU on the input, its output never stored
    int gelu_out;         // y = gelu(x w^T + b): GELU on the output, of kind gelu_kind
    GeluKind gelu_kind;   // gelu_out's GELU (GELU_ERF or GELU_TANH)
    Tensor *pre;          // gelu_out: x w^T + b (N,M), y's dtype, written for the backward; or NULL
    const Tensor *res;    // y = res + x w^T + b: res (N,M) in y's dtype (not y itself); or NULL
} LinearFwdOpts;
// linear_bwd's fusions: what sat around the forward's product, whose backward is fused into the
// linear's (its entry has the contract of each). NULL, or all zero: a plain linear. At most one
// of silu_in, gelu_out and gelu_in (refused by name).
typedef struct LinearBwdOpts {
    int silu_in;          // the forward read silu(x) (linear_fwd's silu_in): x is SiLU's input
    int gelu_out;         // the forward's output was gelu(pre) (linear_fwd's gelu_out)
    int gelu_in;          // x is h = gelu(pre): dx receives pre's gradient
    GeluKind gelu_kind;   // gelu_out's and gelu_in's GELU
    const Tensor *pre;    // the GELU's input, x's dtype: gelu_out (N,M); gelu_in (N,K)
    Tensor *dpre_db;      // gelu_in: (K) fp32 += the column sums of pre's gradient; or NULL
} LinearBwdOpts;
// conv2d_fwd's fusions (its entry): NULL, or ln 0, is a plain convolution.
typedef struct Conv2dFwdOpts {
    int ln;                      // y = layernorm(conv) over Cout with ln_w, ln_b (Cout, the
    const Tensor *ln_w, *ln_b;   // parameter dtype; either may be NULL) and ln_eps
    float ln_eps;
    int gelu_out;                // with ln: y = gelu(layernorm(conv)), of kind gelu_kind
    GeluKind gelu_kind;
} Conv2dFwdOpts;
// mlp_residual_fwd's LayerNorm in front (its entry): the MLP reads layernorm(res).
typedef struct MlpInputNorm {
    const Tensor *w, *b;   // (C) in the parameter dtype, either may be NULL (1 and 0)
    float eps;
} MlpInputNorm;
// adamw's hyperparameters (the update is written at its entry).
typedef struct AdamWArgs {
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    int step;   // 1-based
    // Several parameters in one call, their buffers end to end (the trainer's whole table in one
    // launch): n_decay_runs > 0 cuts the elements into runs, run r ending at decay_ends[r]
    // (exclusive; the last at numel, each a multiple of 8), and weight_decay applies in run r
    // only when decay_on[r]. Both arrays live on the op's device. 0: every element decays.
    int n_decay_runs;
    const uint64_t *decay_ends;
    const uint8_t *decay_on;
} AdamWArgs;
// drop_path_fwd / drop_path_bwd: which samples a residual branch drops (their entries).
typedef struct DropPathArgs {
    float prob;           // drop probability, in [0, 1)
    uint64_t seed;
    int64_t step;         // the batch's place in the run (micro-batch index with accumulation)
    int site;             // which residual branch (trainer: 2 * block + 0 attention/mixing, + 1 MLP)
    int first_sample;     // global index of sample 0 of this batch (rank * per-rank batch)
    const int64_t *step_at;  // NULL, or where on the op's device the step is read instead: a
                             // replayed CUDA graph repeats its kernels' arguments, so a trainer
                             // that replays one writes each step there
} DropPathArgs;

// ---- the ops ----------------------------------------------------------------------------------
#define OP(name, params, args)  \
    void op_##name params;      \
    void cpu_##name params;     \
    void cuda_##name params;
#include "ops_list.h"
#undef OP

#ifdef __cplusplus
}
#endif
