// Every op case of bench/op_cases.c on the CPU: each backward against central finite differences
// of its forward, and the case table itself: every op of kernels/ops_list.h is run by some case,
// and every gradient and upstream gradient names an argument of its case.
//
// The loss of a case is sum over its upstream gradients (dy) of <dy, the output it weights>; a
// gradient is what the backward adds into its tensor (or writes, for a written one). Inputs of
// up to FD_FULL_MAX elements are checked element by element, larger ones along their gradient
// and a random direction (testlib.h's directional check).
#include "testlib.h"
#include "../bench/op_harness.h"
#include "../kernels/ctx.h"

enum { FD_FULL_MAX = 512 };
// The directional check's step: every element moves by at most this, as FD_EPS for one element.
#define FD_DIRECTIONAL_STEP 1e-2f

typedef struct FdState {
    const OpCase *c;
    CaseTensors *ct;
} FdState;

static double case_loss(void *user) {
    FdState *s = user;
    const OpCase *c = s->c;
    case_tensors_reset(s->ct, c);
    case_run(c, s->ct, PHASE_FWD);
    double loss = 0;
    for (int i = 0; i < c->nargs; i++) {
        const CaseArg *a = &c->arg[i];
        if (a->role == ARG_ABSENT || !a->seed_of) continue;
        const int o = op_case_arg(c, a->seed_of);
        if (o >= 0) loss += test_dot(s->ct->t[i], s->ct->t[o]);
    }
    return loss;
}

// The case's gradients against finite differences; returns the number above GRAD_TOL.
static int check_case_grads(const OpCase *c, Ctx *cpu, uint64_t seed) {
    CaseTensors ct;
    case_tensors_make(&ct, c, cpu, DTYPE_F32, seed, 1);
    FdState st = {c, &ct};
    case_tensors_reset(&ct, c);
    case_run(c, &ct, PHASE_BOTH);
    // every gradient first: each finite difference resets the tensors
    Tensor *analytic[OPC_MAX_ARGS] = {0};
    for (int g = 0; g < c->nargs; g++) {
        const CaseArg *a = &c->arg[g];
        if (a->role == ARG_ABSENT || !a->grad_of) continue;
        const int x = op_case_arg(c, a->grad_of);
        if (x < 0 || c->arg[x].role != ARG_IN) continue;
        analytic[g] = test_like(ct.t[g]);   // what the backward added (or wrote)
        const float *after = ct.t[g]->data, *before = ct.init[g];
        float *d = analytic[g]->data;
        for (size_t k = 0; k < analytic[g]->numel; k++)
            d[k] = after[k] - (a->role == ARG_ACC ? before[k] : 0.0f);
    }
    int failed = 0;
    printf("  %s\n", c->title);
    for (int g = 0; g < c->nargs; g++) {
        if (!analytic[g]) continue;
        const CaseArg *a = &c->arg[g];
        const int x = op_case_arg(c, a->grad_of);
        const double err = ct.t[x]->numel <= FD_FULL_MAX
            ? test_gradcheck(a->name, case_loss, &st, ct.t[x], analytic[g])
            : test_gradcheck_directional(a->name, case_loss, &st, ct.t[x], analytic[g],
                                         FD_DIRECTIONAL_STEP, seed + (uint64_t)g);
        if (!(err <= GRAD_TOL)) {
            printf("    ^ %s of %s: above %.0e\n", a->name, c->title, GRAD_TOL);
            failed++;
        }
        test_tensor_free(analytic[g]);
    }
    case_tensors_free(&ct);
    return failed;
}

static void test_every_backward_matches_finite_differences(void **state) {
    (void)state;
    Ctx cpu = ctx_cpu();
    OpCaseList l = {0};
    op_cases_build(&l, CASES_TEST);
    int failed = 0, checked = 0;
    for (int k = 0; k < l.n; k++) {
        const OpCase *c = &l.cases[k];
        // CASE_NO_F32 cases repeat an fp32-mode case's math on the CPU
        if (!c->bwd || (c->flags & (CASE_NO_FD | CASE_NO_F32))) continue;
        failed += check_case_grads(c, &cpu, (uint64_t)k + 1);
        checked++;
    }
    printf("%d cases checked, %d gradients above the tolerance\n", checked, failed);
    op_cases_free(&l);
    assert_int_equal(failed, 0);
}

// The op names of kernels/ops_list.h.
static const char *const OP_NAMES[] = {
#define OP(name, params, args) #name,
#include "../kernels/ops_list.h"
#undef OP
};

static void test_every_op_has_a_case(void **state) {
    (void)state;
    OpCaseList l = {0};
    op_cases_build(&l, CASES_TEST);
    int missing = 0;
    for (size_t i = 0; i < sizeof OP_NAMES / sizeof OP_NAMES[0]; i++)
        if (!op_cases_cover(&l, OP_NAMES[i])) {
            printf("  op %s: no case in bench/op_cases.c runs it\n", OP_NAMES[i]);
            missing++;
        }
    // and every op a case names exists
    for (int k = 0; k < l.n; k++)
        for (int j = 0; j < OPC_MAX_OPS; j++) {
            const char *op = l.cases[k].ops[j];
            if (!op) continue;
            int known = 0;
            for (size_t i = 0; i < sizeof OP_NAMES / sizeof OP_NAMES[0]; i++)
                known |= strcmp(op, OP_NAMES[i]) == 0;
            if (!known) {
                printf("  case %s names op %s, which ops_list.h lacks\n", l.cases[k].title, op);
                missing++;
            }
        }
    printf("%zu ops, %d cases\n", sizeof OP_NAMES / sizeof OP_NAMES[0], l.n);
    op_cases_free(&l);
    assert_int_equal(missing, 0);
}

static void test_every_case_is_well_formed(void **state) {
    (void)state;
    OpCaseList l = {0};
    op_cases_build(&l, CASES_TEST);
    int bad = 0;
    for (int k = 0; k < l.n; k++) {
        const OpCase *c = &l.cases[k];
        int results = 0;
        for (int i = 0; i < c->nargs; i++) {
            const CaseArg *a = &c->arg[i];
            if (a->role == ARG_ABSENT) continue;
            results += a->role == ARG_OUT || a->role == ARG_ACC;
            const char *ref = a->grad_of ? a->grad_of : a->seed_of;
            const int r = ref ? op_case_arg(c, ref) : 0;
            // a gradient of an input; an upstream gradient of a result; a name for every tensor
            if (!a->name || r < 0 ||
                (a->grad_of && c->arg[r].role != ARG_IN) ||
                (a->seed_of && c->arg[r].role != ARG_OUT && c->arg[r].role != ARG_ACC) ||
                (a->bf16_tol < 0)) {
                printf("  case %s: argument %d (%s) is malformed\n", c->title, i,
                       a->name ? a->name : "unnamed");
                bad++;
            }
        }
        if (!results || !c->fwd || !c->ops[0]) {
            printf("  case %s: no result, forward or op\n", c->title);
            bad++;
        }
    }
    op_cases_free(&l);
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_op_has_a_case),
        cmocka_unit_test(test_every_case_is_well_formed),
        cmocka_unit_test(test_every_backward_matches_finite_differences),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
