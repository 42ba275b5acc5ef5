// Routes each op_* to the backend of the context's device, from the list in kernels/ops_list.h
// (which has the contracts).
#include "ops.h"
#include "error.h"

// ROUTE's arguments: an entry's parenthesized argument names, unwrapped.
#define OP_ARGS(...) __VA_ARGS__

// The bytes of an op's tensor arguments, for the profile hook: each argument's address goes to
// the function its type picks (a tensor, a read-only tensor, anything else: 0 bytes).
static double arg_bytes_tensor(Tensor *const *t) { return *t ? (double)tensor_bytes(*t) : 0.0; }
static double arg_bytes_const(const Tensor *const *t) { return *t ? (double)tensor_bytes(*t) : 0.0; }
static double arg_bytes_other(const void *p) { (void)p; return 0.0; }
// An options struct's tensors count as the op's own.
static double arg_bytes_linear_fwd(const LinearFwdOpts *const *o) {
    return *o ? arg_bytes_tensor(&(*o)->pre) + arg_bytes_const(&(*o)->res) : 0.0;
}
static double arg_bytes_linear_bwd(const LinearBwdOpts *const *o) {
    return *o ? arg_bytes_const(&(*o)->pre) + arg_bytes_tensor(&(*o)->dpre_db) : 0.0;
}
static double arg_bytes_conv2d_fwd(const Conv2dFwdOpts *const *o) {
    return *o ? arg_bytes_const(&(*o)->ln_w) + arg_bytes_const(&(*o)->ln_b) : 0.0;
}
static double arg_bytes_mlp_norm(const MlpInputNorm *const *o) {
    return *o ? arg_bytes_const(&(*o)->w) + arg_bytes_const(&(*o)->b) : 0.0;
}
#define ARG_BYTES(a)                                                                      \
    _Generic((a), Tensor *: arg_bytes_tensor, const Tensor *: arg_bytes_const,            \
             const LinearFwdOpts *: arg_bytes_linear_fwd,                                 \
             const LinearBwdOpts *: arg_bytes_linear_bwd,                                 \
             const Conv2dFwdOpts *: arg_bytes_conv2d_fwd,                                 \
             const MlpInputNorm *: arg_bytes_mlp_norm, default: arg_bytes_other)(&(a))
// + ARG_BYTES(a) for every argument (an op has at most 12).
#define ARGS_N(...) ARGS_N_(__VA_ARGS__, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define ARGS_N_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, n, ...) n
#define SUM_CAT(a, b) SUM_CAT_(a, b)
#define SUM_CAT_(a, b) a##b
#define SUM_1(a) + ARG_BYTES(a)
#define SUM_2(a, ...) + ARG_BYTES(a) SUM_1(__VA_ARGS__)
#define SUM_3(a, ...) + ARG_BYTES(a) SUM_2(__VA_ARGS__)
#define SUM_4(a, ...) + ARG_BYTES(a) SUM_3(__VA_ARGS__)
#define SUM_5(a, ...) + ARG_BYTES(a) SUM_4(__VA_ARGS__)
#define SUM_6(a, ...) + ARG_BYTES(a) SUM_5(__VA_ARGS__)
#define SUM_7(a, ...) + ARG_BYTES(a) SUM_6(__VA_ARGS__)
#define SUM_8(a, ...) + ARG_BYTES(a) SUM_7(__VA_ARGS__)
#define SUM_9(a, ...) + ARG_BYTES(a) SUM_8(__VA_ARGS__)
#define SUM_10(a, ...) + ARG_BYTES(a) SUM_9(__VA_ARGS__)
#define SUM_11(a, ...) + ARG_BYTES(a) SUM_10(__VA_ARGS__)
#define SUM_12(a, ...) + ARG_BYTES(a) SUM_11(__VA_ARGS__)
#define OP_BYTES(...) (0.0 SUM_CAT(SUM_, ARGS_N(__VA_ARGS__))(__VA_ARGS__))

// The profile's name of a call: the op's, or for an op whose options pick a fused kernel, the op's
// and the option ("linear_fwd+gelu_out"), so each fused kernel keeps a row of its own.
static const char *label_linear_fwd(const LinearFwdOpts *o) {
    if (!o) return "linear_fwd";
    return o->silu_in ? "linear_fwd+silu_in" : o->gelu_out ? "linear_fwd+gelu_out"
         : o->res ? "linear_fwd+res" : "linear_fwd";
}
static const char *label_linear_bwd(const LinearBwdOpts *o) {
    if (!o) return "linear_bwd";
    return o->silu_in ? "linear_bwd+silu_in" : o->gelu_out ? "linear_bwd+gelu_out"
         : o->gelu_in ? "linear_bwd+gelu_in" : "linear_bwd";
}
static const char *label_layernorm_fwd(const Tensor *r) {
    return r ? "layernorm_fwd+add" : "layernorm_fwd";
}
// OP_LABEL(name): label_NAME(...) on the op's parameters for the ops given a LABEL_OF_NAME below,
// else "name". A defined LABEL_OF_NAME expands to "~, call", which shifts the call into the
// argument OP_LABEL_PICK_ returns; an undefined one stays a single token and leaves "name" there.
#define LABEL_OF_linear_fwd ~, label_linear_fwd(opts)
#define LABEL_OF_linear_bwd ~, label_linear_bwd(opts)
#define LABEL_OF_layernorm_fwd ~, label_layernorm_fwd(r)
#define OP_LABEL(name) OP_LABEL_PICK(LABEL_OF_##name, #name, ~)
#define OP_LABEL_PICK(...) OP_LABEL_PICK_(__VA_ARGS__)
#define OP_LABEL_PICK_(probe, label, ...) label

#ifdef CGSPN_CUDA
// CUDA kernels are weak references: an op whose kernel is not in this build fails by name
// instead of breaking the link.
#define OP(name, params, args) extern __typeof__(cpu_##name) cuda_##name __attribute__((weak));
#include "ops_list.h"
#undef OP
#define ROUTE(name, ...)                                                         \
    do {                                                                         \
        const char *label_ = OP_LABEL(name);                                     \
        if (ctx->profile) ctx->profile(ctx, label_, 0, OP_BYTES(__VA_ARGS__));   \
        if (ctx->device == DEVICE_CUDA) {                                        \
            CG_CHECK(cuda_##name != NULL, "run with device = cpu",               \
                     "op " #name " has no CUDA kernel in this build");           \
            cuda_##name(__VA_ARGS__);                                            \
        } else {                                                                 \
            cpu_##name(__VA_ARGS__);                                             \
        }                                                                        \
        if (ctx->profile) ctx->profile(ctx, label_, 1, 0.0);                     \
    } while (0)
#else
#define ROUTE(name, ...)                                                         \
    do {                                                                         \
        CG_CHECK(ctx->device == DEVICE_CPU, "rebuild with nvcc on PATH",         \
                 "op " #name ": this build has no CUDA backend");                \
        const char *label_ = OP_LABEL(name);                                     \
        if (ctx->profile) ctx->profile(ctx, label_, 0, OP_BYTES(__VA_ARGS__));   \
        cpu_##name(__VA_ARGS__);                                                 \
        if (ctx->profile) ctx->profile(ctx, label_, 1, 0.0);                     \
    } while (0)
#endif

// Every op_NAME: its parameters, routed with its argument names.
#define OP(name, params, args) \
    void op_##name params { ROUTE(name, OP_ARGS args); }
#include "ops_list.h"
#undef OP
