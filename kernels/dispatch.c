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
#define ARG_BYTES(a)                                                                      \
    _Generic((a), Tensor *: arg_bytes_tensor, const Tensor *: arg_bytes_const,            \
             default: arg_bytes_other)(&(a))
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

#ifdef CGSPN_CUDA
// CUDA kernels are weak references: an op whose kernel is not in this build fails by name
// instead of breaking the link.
#define OP(name, params, args) extern __typeof__(cpu_##name) cuda_##name __attribute__((weak));
#include "ops_list.h"
#undef OP
#define ROUTE(name, ...)                                                      \
    do {                                                                      \
        if (ctx->profile) ctx->profile(ctx, #name, 0, OP_BYTES(__VA_ARGS__)); \
        if (ctx->device == DEVICE_CUDA) {                                     \
            CG_CHECK(cuda_##name != NULL, "run with device = cpu",            \
                     "op " #name " has no CUDA kernel in this build");        \
            cuda_##name(__VA_ARGS__);                                         \
        } else {                                                              \
            cpu_##name(__VA_ARGS__);                                          \
        }                                                                     \
        if (ctx->profile) ctx->profile(ctx, #name, 1, 0.0);                   \
    } while (0)
#else
#define ROUTE(name, ...)                                                      \
    do {                                                                      \
        CG_CHECK(ctx->device == DEVICE_CPU, "rebuild with nvcc on PATH",      \
                 "op " #name ": this build has no CUDA backend");             \
        if (ctx->profile) ctx->profile(ctx, #name, 0, OP_BYTES(__VA_ARGS__)); \
        cpu_##name(__VA_ARGS__);                                              \
        if (ctx->profile) ctx->profile(ctx, #name, 1, 0.0);                   \
    } while (0)
#endif

// Every op_NAME: its parameters, routed with its argument names.
#define OP(name, params, args) \
    void op_##name params { ROUTE(name, OP_ARGS args); }
#include "ops_list.h"
#undef OP
