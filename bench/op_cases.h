// Every op of kernels/ops_list.h as cases: the op (or a forward and its backward), shapes,
// dtypes, how each argument is filled and how closely each result must match. One table that
// tests/gpu/test_ops_gpu.c runs on the GPU against the CPU, tests/test_op_grads.c checks against
// finite differences and `cgspn bench ops` times (bench/op_harness.h runs a case).
//
// A case names its tensors in one list; the ops read them by the case's own enum. A forward reads
// ARG_IN tensors and writes ARG_OUT ones; a backward reads the forward's results and adds into
// ARG_ACC gradients (or writes ARG_OUT ones). grad_of and seed_of tie a case to calculus: a
// gradient names the input it differentiates, and the upstream gradient (dy) names the output it
// weights, so the loss checked by finite differences is sum over seeds of <seed, output>.
#pragma once
#include "../kernels/ops.h"

enum { OPC_MAX_ARGS = 14, OPC_MAX_OPS = 4, OPC_MAX_PARAMS = 4 };

typedef enum {
    ARG_ABSENT = 0,   // passed as NULL
    ARG_IN,           // read only: filled
    ARG_ACC,          // added into (gradients, optimizer state): filled, compared after
    ARG_OUT,          // written: starts NaN (an element not written shows), compared after
    ARG_SCRATCH,      // written by the forward for the backward in a backend's own layout
                      // (convolution columns): starts NaN, never compared
} ArgRole;

typedef enum {
    TYPE_ACT = 0,     // the mode's activation dtype: fp32 or bf16
    TYPE_F32,         // fp32 in every mode (statistics, losses, parameter gradients)
} ArgType;

typedef enum {
    FILL_UNIFORM = 0, // uniform in [lo, hi)
    FILL_ROWS_SUM1,   // positive rows (last dim) that sum to 1: soft targets
} ArgFill;

typedef struct CaseArg {
    const char *name;
    ArgRole role;
    ArgType type;
    ArgFill fill;
    float lo, hi;
    int act_values;        // TYPE_F32 holding values the mode's dtype can represent (an fp32
                           // stream read as bf16 by a bf16 kernel)
    double bf16_tol;       // bf16 mode: allowed ||gpu - cpu|| / ||cpu||, with its reason at the case
    const char *grad_of;   // a gradient: the input it differentiates
    const char *seed_of;   // an upstream gradient: the output it weights
    int ndim, shape[TENSOR_MAX_DIMS];
} CaseArg;

typedef struct OpCase OpCase;
// Runs one phase of a case: t holds the case's tensors in its argument order (NULL: absent).
typedef void (*CasePhase)(Ctx *ctx, Tensor *const *t, const OpCase *c);

enum {
    CASE_NO_F32 = 1,        // bf16 mode only (a mixed-dtype case that fp32 mode would repeat)
    CASE_NO_BF16 = 2,       // fp32 mode only
    CASE_NO_FD = 4,         // no finite-difference check (integer-like or huge inputs)
};

struct OpCase {
    char title[112];                   // "layernorm (7, 1155)"
    const char *ops[OPC_MAX_OPS];      // the ops of ops_list.h it runs
    int nargs;
    CaseArg arg[OPC_MAX_ARGS];
    CasePhase fwd, bwd;                // bwd NULL: a forward alone
    float f[OPC_MAX_PARAMS];           // scalar parameters (eps, scale, decay)
    int i[OPC_MAX_PARAMS];             // integer parameters (flags, heads, kind)
    double f32_tol;                    // fp32 mode: allowed relative error of every result
    unsigned flags;                    // CASE_*
    double flops;                      // the products' FLOPs per forward + backward (bench), or 0
};

typedef struct OpCaseList {
    OpCase *cases;
    int n, cap;
} OpCaseList;

typedef enum {
    CASES_TEST,    // small and odd shapes that reach every kernel path
    CASES_BENCH,   // training sizes, bf16, for `cgspn bench ops`
} CaseSet;

// Every case of the set, appended to l (free with op_cases_free).
void op_cases_build(OpCaseList *l, CaseSet set);
void op_cases_free(OpCaseList *l);
// The index of the argument called name in c, or -1.
int op_case_arg(const OpCase *c, const char *name);
// Whether op (an ops_list.h name) is run by some case of l.
int op_cases_cover(const OpCaseList *l, const char *op);
