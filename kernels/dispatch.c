// Routes each op_* to the backend of the context's device, from the list in kernels/ops_list.h
// (which has the contracts).
#include "ops.h"
#include "error.h"

// ROUTE's arguments: an entry's parenthesized argument names, unwrapped.
#define OP_ARGS(...) __VA_ARGS__

#ifdef CGSPN_CUDA
// CUDA kernels are weak references: an op whose kernel is not in this build fails by name
// instead of breaking the link.
#define OP(name, params, args) extern __typeof__(cpu_##name) cuda_##name __attribute__((weak));
#include "ops_list.h"
#undef OP
#define ROUTE(name, ...)                                                      \
    do {                                                                      \
        if (ctx->profile) ctx->profile(ctx, #name, 0);                        \
        if (ctx->device == DEVICE_CUDA) {                                     \
            CG_CHECK(cuda_##name != NULL, "run with device = cpu",            \
                     "op " #name " has no CUDA kernel in this build");        \
            cuda_##name(__VA_ARGS__);                                         \
        } else {                                                              \
            cpu_##name(__VA_ARGS__);                                          \
        }                                                                     \
        if (ctx->profile) ctx->profile(ctx, #name, 1);                        \
    } while (0)
#else
#define ROUTE(name, ...)                                                      \
    do {                                                                      \
        CG_CHECK(ctx->device == DEVICE_CPU, "rebuild with nvcc on PATH",      \
                 "op " #name ": this build has no CUDA backend");             \
        if (ctx->profile) ctx->profile(ctx, #name, 0);                        \
        cpu_##name(__VA_ARGS__);                                              \
        if (ctx->profile) ctx->profile(ctx, #name, 1);                        \
    } while (0)
#endif

// Every op_NAME: its parameters, routed with its argument names.
#define OP(name, params, args) \
    void op_##name params { ROUTE(name, OP_ARGS args); }
#include "ops_list.h"
#undef OP
