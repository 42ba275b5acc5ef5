// C-GSPN propagation (docs/design.md#cgspn-layer steps 3-5): the CPU reference kernels cpu_gspn_scan_fwd/bwd
// against a naive double-precision reference, hand-computed values, the row-stochastic
// property and central finite differences.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include "testlib.h"
#include "../kernels/ops.h"

enum { TB, BT, LR, RL, DIRS };
static const char *const DIR_NAME[DIRS] = {"TB", "BT", "LR", "RL"};

// Gate slots within a direction's block (kernels/ops.h): lam, u, then wt_k for k = -1, 0, +1.
enum { SLOT_LAM = 0, SLOT_U = 1, SLOT_WT = 2 };

// fp32 kernel vs the double reference: scans of at most 6 steps on values of order 1, each
// step a handful of fp32 roundings (~6e-8 each); 1e-5 relative to (1 + |value|) leaves a wide
// margin and is still far below what a wrong index or weight produces (order 0.1 and up).
#define FWD_TOL 1e-5
// Hand-computed case: sigmoid(+-ln 3) is 0.75 / 0.25 only up to fp32 rounding of ln 3 and expf,
// and values up to 6 carry fp32 rounding of ~5e-7 per operation.
#define HAND_TOL 1e-5
// Calling backward twice vs twice one call: one fp32 addition per element, so the results agree
// to fp32 rounding (the kernel adds each gradient once; this only guards the comparison).
#define ACC_TOL 1e-6


// One propagation problem: inputs, the output, and r, the weights of the test loss sum(yc * r).
typedef struct Problem {
    int B, H, W, Cc, shared_w;
    Tensor *xc, *gates, *merge, *yc, *hidden, *r;
} Problem;

static int gate_width(int Cc, int shared_w) { return shared_w ? 4 * (2 * Cc + 3) : 20 * Cc; }

// Address of a gate, written straight from the layout in kernels/ops.h. For wt, slot is
// SLOT_WT + k + 1; in the shared variant the channel is ignored.
static float *gate_at(const Problem *p, int b, int i, int j, int d, int slot, int c) {
    const int G = gate_width(p->Cc, p->shared_w);
    float *g = tensor_f32(p->gates) + (((size_t)b * p->H + i) * p->W + j) * G;
    if (!p->shared_w) return g + d * 5 * p->Cc + slot * p->Cc + c;
    const int base = d * (2 * p->Cc + 3);
    return slot < SLOT_WT ? g + base + slot * p->Cc + c : g + base + 2 * p->Cc + (slot - SLOT_WT);
}

static size_t tok(const Problem *p, int b, int i, int j, int c) {
    return (((size_t)b * p->H + i) * p->W + j) * p->Cc + c;
}

// Random inputs: xc, lam, u in [-1, 1], raw weights in [-2, 2] (sigmoid not saturated),
// merge in [-1, 1] unless one_hot names a direction (then merge = e_d), r in [-1, 1].
static Problem *problem_new(int B, int H, int W, int Cc, int shared_w, int one_hot,
                            uint64_t seed) {
    Problem *p = calloc(1, sizeof(Problem));
    *p = (Problem){.B = B, .H = H, .W = W, .Cc = Cc, .shared_w = shared_w};
    p->xc = test_tensor(4, B, H, W, Cc);
    p->gates = test_tensor(4, B, H, W, gate_width(Cc, shared_w));
    p->merge = test_tensor(1, DIRS);
    p->yc = test_tensor(4, B, H, W, Cc);
    p->hidden = test_tensor(5, DIRS, B, H, W, Cc);
    p->r = test_tensor(4, B, H, W, Cc);
    test_fill(p->xc, seed + 1, -1.0f, 1.0f);
    test_fill(p->gates, seed + 2, -2.0f, 2.0f);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < H; i++)
            for (int j = 0; j < W; j++)
                for (int d = 0; d < DIRS; d++)
                    for (int c = 0; c < Cc; c++) {
                        *gate_at(p, b, i, j, d, SLOT_LAM, c) *= 0.5f;
                        *gate_at(p, b, i, j, d, SLOT_U, c) *= 0.5f;
                    }
    test_fill(p->merge, seed + 3, -1.0f, 1.0f);
    if (one_hot >= 0)
        for (int d = 0; d < DIRS; d++) tensor_f32(p->merge)[d] = d == one_hot ? 1.0f : 0.0f;
    test_fill(p->r, seed + 4, -1.0f, 1.0f);
    return p;
}

static void problem_free(Problem *p) {
    test_tensor_free(p->xc);
    test_tensor_free(p->gates);
    test_tensor_free(p->merge);
    test_tensor_free(p->yc);
    test_tensor_free(p->hidden);
    test_tensor_free(p->r);
    free(p);
}

// ---- naive reference ---------------------------------------------------------------------------
// Every direction is written as the TB scan of docs/design.md#cgspn-layer over an R x Q grid, rows r in order,
// reading row r-1 at columns q+k; (r, q) maps explicitly to the image's (i, j).
static void ref_map(const Problem *p, int d, int r, int q, int *i, int *j) {
    switch (d) {
    case TB: *i = r;          *j = q;          break;   // rows top to bottom
    case BT: *i = p->H - 1 - r; *j = q;        break;   // rows bottom to top
    case LR: *i = q;          *j = r;          break;   // columns left to right, neighbours in i
    default: *i = q;          *j = p->W - 1 - r; break; // RL: columns right to left
    }
}

// yc (B,H,W,Cc) and hidden (4,B,H,W,Cc) in double.
static void ref_forward(const Problem *p, double *yc, double *hid) {
    const size_t plane = p->xc->numel;
    const float *xc = tensor_f32(p->xc), *m = tensor_f32(p->merge);
    for (size_t n = 0; n < plane; n++) yc[n] = 0.0;
    for (int d = 0; d < DIRS; d++) {
        const int R = d == TB || d == BT ? p->H : p->W;
        const int Q = d == TB || d == BT ? p->W : p->H;
        for (int b = 0; b < p->B; b++)
            for (int r = 0; r < R; r++)
                for (int q = 0; q < Q; q++)
                    for (int c = 0; c < p->Cc; c++) {
                        int i, j;
                        ref_map(p, d, r, q, &i, &j);
                        double h = (double)*gate_at(p, b, i, j, d, SLOT_LAM, c) * xc[tok(p, b, i, j, c)];
                        if (r > 0) {
                            double a[3] = {0, 0, 0}, S = 0;
                            for (int k = -1; k <= 1; k++) {
                                if (q + k < 0 || q + k >= Q) continue;   // no such neighbour
                                double wt = *gate_at(p, b, i, j, d, SLOT_WT + k + 1, c);
                                a[k + 1] = 1.0 / (1.0 + exp(-wt));
                                S += a[k + 1];
                            }
                            for (int k = -1; k <= 1; k++) {
                                if (q + k < 0 || q + k >= Q) continue;
                                int pi, pj;
                                ref_map(p, d, r - 1, q + k, &pi, &pj);
                                h += a[k + 1] / fmax(S, 1e-7) * hid[d * plane + tok(p, b, pi, pj, c)];
                            }
                        }
                        hid[d * plane + tok(p, b, i, j, c)] = h;
                        yc[tok(p, b, i, j, c)] += m[d] * *gate_at(p, b, i, j, d, SLOT_U, c) * h;
                    }
    }
}

// max over elements of |got - want| / (1 + |want|)
static double max_err(const float *got, const double *want, size_t n) {
    double e = 0.0;
    for (size_t k = 0; k < n; k++) e = fmax(e, fabs(got[k] - want[k]) / (1.0 + fabs(want[k])));
    return e;
}

// ---- tests ---------------------------------------------------------------------------------------
static const int SHAPES_FWD[][4] = {{2, 3, 5, 3}, {2, 4, 1, 2}, {2, 1, 6, 3}};

static void test_gspn_forward_matches_naive_reference(void **state) {
    Ctx ctx = ctx_cpu();
    for (size_t s = 0; s < sizeof SHAPES_FWD / sizeof SHAPES_FWD[0]; s++)
        for (int shared = 0; shared <= 1; shared++)
            for (int one_hot = -1; one_hot < DIRS; one_hot++) {
                const int *sh = SHAPES_FWD[s];
                Problem *p = problem_new(sh[0], sh[1], sh[2], sh[3], shared, one_hot, 100 + s);
                double *yc = malloc(p->xc->numel * sizeof(double));
                double *hid = malloc(p->hidden->numel * sizeof(double));
                ref_forward(p, yc, hid);
                cpu_gspn_scan_fwd(&ctx, p->xc, p->gates, p->merge, shared, p->yc, p->hidden);
                double ey = max_err(tensor_f32(p->yc), yc, p->xc->numel);
                double eh = max_err(tensor_f32(p->hidden), hid, p->hidden->numel);
                if (ey > FWD_TOL || eh > FWD_TOL)
                    printf("    %dx%dx%dx%d shared=%d merge=%s: yc err %.2e, hidden err %.2e\n",
                           sh[0], sh[1], sh[2], sh[3], shared,
                           one_hot < 0 ? "all" : DIR_NAME[one_hot], ey, eh);
                assert_true(ey <= FWD_TOL);
                assert_true(eh <= FWD_TOL);
                // Without hidden the output is the same.
                Tensor *yc2 = test_like(p->yc);
                cpu_gspn_scan_fwd(&ctx, p->xc, p->gates, p->merge, shared, yc2, NULL);
                assert_memory_equal(yc2->data, p->yc->data, p->yc->numel * sizeof(float));
                test_tensor_free(yc2);
                free(yc);
                free(hid);
                problem_free(p);
            }
}

// H = W = 2, Cc = 1, TB only (merge = e_TB), per-channel weights, lam = 1, u = 0.5,
// wt_{-1} = 0, wt_0 = ln 3, wt_{+1} = -ln 3, so a_{-1} = 0.5, a_0 = 0.75, a_{+1} = 0.25.
// xc = [[1, 2], [3, 4]].
// Forward:
//   row 0: h = lam xc = 1, 2 (no previous row).
//   (1,0): neighbours k = 0, +1 exist: S = 1,    w_0 = 0.75, w_{+1} = 0.25
//          h = 3 + 0.75 * 1 + 0.25 * 2 = 4.25
//   (1,1): neighbours k = -1, 0 exist: S = 1.25, w_{-1} = 0.4, w_0 = 0.6
//          h = 4 + 0.4 * 1 + 0.6 * 2 = 5.6
//   yc = 0.5 h = 0.5, 1, 2.125, 2.8
// Backward with dyc = 1:
//   dh row 1 = m u dyc = 0.5, 0.5
//   dh(0,0) = 0.5 + w_0(1,0) 0.5 + w_{-1}(1,1) 0.5 = 0.5 + 0.375 + 0.2 = 1.075
//   dh(0,1) = 0.5 + w_{+1}(1,0) 0.5 + w_0(1,1) 0.5 = 0.5 + 0.125 + 0.3 = 0.925
//   dxc = lam dh = 1.075, 0.925, 0.5, 0.5;  dlam = xc dh = 1.075, 1.85, 1.5, 2
//   du = m h dyc = h;  dmerge[TB] = sum u h dyc = 0.5 * 12.85 = 6.425
//   (1,0): dw_0 = 0.5 * h(0,0) = 0.5, dw_{+1} = 0.5 * h(0,1) = 1, sum w dw = 0.625
//          dwt_0 = 0.75 * 0.25 * (0.5 - 0.625) / 1 = -0.0234375
//          dwt_{+1} = 0.25 * 0.75 * (1 - 0.625) / 1 = 0.0703125, dwt_{-1} = 0 (missing)
//   (1,1): dw_{-1} = 0.5, dw_0 = 1, sum w dw = 0.4 * 0.5 + 0.6 * 1 = 0.8
//          dwt_{-1} = 0.5 * 0.5 * (0.5 - 0.8) / 1.25 = -0.06
//          dwt_0 = 0.75 * 0.25 * (1 - 0.8) / 1.25 = 0.03, dwt_{+1} = 0 (missing)
//   row 0 weights multiply h[-1] = 0: dwt = 0.
static void test_gspn_tb_tiny_case_matches_hand_computed_values(void **state) {
    Ctx ctx = ctx_cpu();
    Problem *p = problem_new(1, 2, 2, 1, 0, TB, 7);
    const float xc[4] = {1, 2, 3, 4};
    memcpy(p->xc->data, xc, sizeof xc);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            *gate_at(p, 0, i, j, TB, SLOT_LAM, 0) = 1.0f;
            *gate_at(p, 0, i, j, TB, SLOT_U, 0) = 0.5f;
            *gate_at(p, 0, i, j, TB, SLOT_WT + 0, 0) = 0.0f;
            *gate_at(p, 0, i, j, TB, SLOT_WT + 1, 0) = logf(3.0f);
            *gate_at(p, 0, i, j, TB, SLOT_WT + 2, 0) = -logf(3.0f);
        }
    cpu_gspn_scan_fwd(&ctx, p->xc, p->gates, p->merge, 0, p->yc, p->hidden);
    const float h_want[4] = {1, 2, 4.25f, 5.6f}, yc_want[4] = {0.5f, 1, 2.125f, 2.8f};
    for (int n = 0; n < 4; n++) {
        assert_float_equal(tensor_f32(p->hidden)[TB * 4 + n], h_want[n], HAND_TOL);
        assert_float_equal(tensor_f32(p->yc)[n], yc_want[n], HAND_TOL);
    }

    Tensor *dyc = test_like(p->yc), *dxc = test_like(p->xc), *dgates = test_like(p->gates);
    Tensor *dmerge = test_like(p->merge);
    for (int n = 0; n < 4; n++) tensor_f32(dyc)[n] = 1.0f;
    cpu_gspn_scan_bwd(&ctx, dyc, p->xc, p->gates, p->merge, 0, p->hidden, 0, dxc, dgates, dmerge);
    const float dxc_want[4] = {1.075f, 0.925f, 0.5f, 0.5f}, dlam_want[4] = {1.075f, 1.85f, 1.5f, 2};
    Problem dp = *p;            // gate_at on the gradient
    dp.gates = dgates;
    for (int n = 0; n < 4; n++) {
        const int i = n / 2, j = n % 2;
        assert_float_equal(tensor_f32(dxc)[n], dxc_want[n], HAND_TOL);
        assert_float_equal(*gate_at(&dp, 0, i, j, TB, SLOT_LAM, 0), dlam_want[n], HAND_TOL);
        assert_float_equal(*gate_at(&dp, 0, i, j, TB, SLOT_U, 0), h_want[n], HAND_TOL);
    }
    const float dwt_want[2][2][3] = {{{0, 0, 0}, {0, 0, 0}},
                                     {{0, -0.0234375f, 0.0703125f}, {-0.06f, 0.03f, 0}}};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 3; k++)
                assert_float_equal(*gate_at(&dp, 0, i, j, TB, SLOT_WT + k, 0), dwt_want[i][j][k],
                                   HAND_TOL);
    assert_float_equal(tensor_f32(dmerge)[TB], 6.425f, HAND_TOL);
    // Other directions have m_d = 0: their gates get no gradient, but dmerge does.
    for (int d = BT; d < DIRS; d++) {
        double want = 0;
        for (int n = 0; n < 4; n++)
            want += (double)*gate_at(p, 0, n / 2, n % 2, d, SLOT_U, 0) *
                    tensor_f32(p->hidden)[d * 4 + n];
        assert_float_equal(tensor_f32(dmerge)[d], want, 1e-5);
        for (int n = 0; n < 4; n++)
            for (int slot = 0; slot < 5; slot++)
                assert_float_equal(*gate_at(&dp, 0, n / 2, n % 2, d, slot, 0), 0.0f, 0.0f);
    }
    test_tensor_free(dyc);
    test_tensor_free(dxc);
    test_tensor_free(dgates);
    test_tensor_free(dmerge);
    problem_free(p);
}

// Rows of w sum to 1, so with xc = lam = u = 1 every scan counts the steps taken so far:
// h_TB[i,j] = i+1, h_BT = H-i, h_LR = j+1, h_RL = W-j, whatever the raw weights are.
static void test_gspn_constant_input_hidden_counts_scan_steps(void **state) {
    Ctx ctx = ctx_cpu();
    for (int shared = 0; shared <= 1; shared++) {
        Problem *p = problem_new(2, 5, 4, 3, shared, -1, 31 + shared);
        for (size_t n = 0; n < p->xc->numel; n++) tensor_f32(p->xc)[n] = 1.0f;
        for (int b = 0; b < p->B; b++)
            for (int i = 0; i < p->H; i++)
                for (int j = 0; j < p->W; j++)
                    for (int d = 0; d < DIRS; d++)
                        for (int c = 0; c < p->Cc; c++) {
                            *gate_at(p, b, i, j, d, SLOT_LAM, c) = 1.0f;
                            *gate_at(p, b, i, j, d, SLOT_U, c) = 1.0f;
                        }
        cpu_gspn_scan_fwd(&ctx, p->xc, p->gates, p->merge, shared, p->yc, p->hidden);
        const size_t plane = p->xc->numel;
        for (int b = 0; b < p->B; b++)
            for (int i = 0; i < p->H; i++)
                for (int j = 0; j < p->W; j++)
                    for (int c = 0; c < p->Cc; c++) {
                        const float want[DIRS] = {i + 1, p->H - i, j + 1, p->W - j};
                        for (int d = 0; d < DIRS; d++)
                            assert_float_equal(tensor_f32(p->hidden)[d * plane + tok(p, b, i, j, c)],
                                               want[d], FWD_TOL * 10);
                    }
        problem_free(p);
    }
}

static double problem_loss(void *user) {
    Problem *p = user;
    Ctx ctx = ctx_cpu();
    cpu_gspn_scan_fwd(&ctx, p->xc, p->gates, p->merge, p->shared_w, p->yc, NULL);
    return test_dot(p->yc, p->r);
}

typedef struct Grads { Tensor *dxc, *dgates, *dmerge; } Grads;

static Grads grads_new(const Problem *p) {
    return (Grads){test_like(p->xc), test_like(p->gates), test_like(p->merge)};
}

static void grads_free(Grads g) {
    test_tensor_free(g.dxc);
    test_tensor_free(g.dgates);
    test_tensor_free(g.dmerge);
}

// Forward (saving hidden unless use_hidden is 0), then backward of sum(yc * r) into g.
static void problem_backward(Problem *p, int use_hidden, Grads g) {
    Ctx ctx = ctx_cpu();
    Tensor *hidden = use_hidden ? p->hidden : NULL;
    cpu_gspn_scan_fwd(&ctx, p->xc, p->gates, p->merge, p->shared_w, p->yc, hidden);
    cpu_gspn_scan_bwd(&ctx, p->r, p->xc, p->gates, p->merge, p->shared_w, hidden, 0,
                      g.dxc, g.dgates, g.dmerge);
}

static const int SHAPES_GRAD[][4] = {{2, 3, 5, 3}, {1, 4, 1, 1}, {1, 1, 6, 3}, {2, 5, 2, 1},
                                     {1, 3, 4, 1}};

static void test_gspn_backward_matches_finite_differences(void **state) {
    double worst = 0.0;
    for (size_t s = 0; s < sizeof SHAPES_GRAD / sizeof SHAPES_GRAD[0]; s++)
        for (int shared = 0; shared <= 1; shared++)
            for (int one_hot = -1; one_hot < DIRS; one_hot++) {
                const int *sh = SHAPES_GRAD[s];
                Problem *p = problem_new(sh[0], sh[1], sh[2], sh[3], shared, one_hot, 200 + s);
                Grads g = grads_new(p);
                problem_backward(p, 1, g);
                char what[3][64];
                const char *names[3] = {"dxc", "dgates", "dmerge"};
                Tensor *inputs[3] = {p->xc, p->gates, p->merge};
                Tensor *grads[3] = {g.dxc, g.dgates, g.dmerge};
                for (int n = 0; n < 3; n++) {
                    snprintf(what[n], sizeof what[n], "%s %dx%dx%dx%d %s %s", names[n], sh[0],
                             sh[1], sh[2], sh[3], shared ? "shared" : "chan",
                             one_hot < 0 ? "all" : DIR_NAME[one_hot]);
                    double err = test_gradcheck(what[n], problem_loss, p, inputs[n], grads[n]);
                    worst = fmax(worst, err);
                    assert_true(err < GRAD_TOL);
                }
                grads_free(g);
                problem_free(p);
            }
    printf("    worst gradcheck rel err %.2e\n", worst);
}

static void test_gspn_backward_recompute_equals_saved_hidden(void **state) {
    for (int shared = 0; shared <= 1; shared++) {
        Problem *p = problem_new(2, 3, 5, 3, shared, -1, 300 + shared);
        Grads saved = grads_new(p), recomputed = grads_new(p);
        problem_backward(p, 1, saved);
        problem_backward(p, 0, recomputed);
        assert_memory_equal(saved.dxc->data, recomputed.dxc->data, tensor_bytes(saved.dxc));
        assert_memory_equal(saved.dgates->data, recomputed.dgates->data, tensor_bytes(saved.dgates));
        assert_memory_equal(saved.dmerge->data, recomputed.dmerge->data, tensor_bytes(saved.dmerge));

        // A NULL gradient is skipped and leaves the others as they are.
        Ctx ctx = ctx_cpu();
        Grads one = grads_new(p);
        cpu_gspn_scan_bwd(&ctx, p->r, p->xc, p->gates, p->merge, shared, NULL, 0, one.dxc, NULL, NULL);
        cpu_gspn_scan_bwd(&ctx, p->r, p->xc, p->gates, p->merge, shared, NULL, 0, NULL, one.dgates, NULL);
        cpu_gspn_scan_bwd(&ctx, p->r, p->xc, p->gates, p->merge, shared, NULL, 0, NULL, NULL, one.dmerge);
        cpu_gspn_scan_bwd(&ctx, p->r, p->xc, p->gates, p->merge, shared, NULL, 0, NULL, NULL, NULL);
        assert_memory_equal(one.dxc->data, saved.dxc->data, tensor_bytes(saved.dxc));
        assert_memory_equal(one.dgates->data, saved.dgates->data, tensor_bytes(saved.dgates));
        assert_memory_equal(one.dmerge->data, saved.dmerge->data, tensor_bytes(saved.dmerge));
        grads_free(one);
        grads_free(saved);
        grads_free(recomputed);
        problem_free(p);
    }
}

static void test_gspn_backward_accumulates_into_gradients(void **state) {
    for (int shared = 0; shared <= 1; shared++) {
        Problem *p = problem_new(2, 3, 5, 3, shared, -1, 400 + shared);
        Grads once = grads_new(p), twice = grads_new(p);
        problem_backward(p, 1, once);
        problem_backward(p, 1, twice);
        problem_backward(p, 1, twice);
        Tensor *a[3] = {once.dxc, once.dgates, once.dmerge};
        Tensor *b[3] = {twice.dxc, twice.dgates, twice.dmerge};
        for (int n = 0; n < 3; n++) {
            for (size_t k = 0; k < a[n]->numel; k++) tensor_f32(a[n])[k] *= 2.0f;
            assert_true(test_rel_err(b[n]->data, a[n]->data, a[n]->numel) < ACC_TOL);
        }
        grads_free(once);
        grads_free(twice);
        problem_free(p);
    }
}

// ---- refusals (kernels/gspn_scan_shape.h, shared with the CUDA op) ---------------------------------

// Shared-weight gates of a per-channel width: G = 20 * Cc = 40 where 4 * (2 * Cc + 3) = 28.
static void scan_shared_with_per_channel_gates(void) {
    Ctx ctx = ctx_cpu();
    Tensor *xc = test_tensor(4, 1, 3, 4, 2), *gates = test_tensor(4, 1, 3, 4, 40);
    Tensor *merge = test_tensor(1, 4), *yc = test_like(xc);
    cpu_gspn_scan_fwd(&ctx, xc, gates, merge, 1, yc, NULL);
}

// A saved hidden state of one direction instead of four.
static void scan_backward_with_one_direction_of_hidden(void) {
    Ctx ctx = ctx_cpu();
    Tensor *xc = test_tensor(4, 1, 3, 4, 2), *gates = test_tensor(4, 1, 3, 4, 28);
    Tensor *merge = test_tensor(1, 4), *dyc = test_like(xc), *dxc = test_like(xc);
    Tensor *hidden = test_tensor(4, 1, 3, 4, 2);
    cpu_gspn_scan_bwd(&ctx, dyc, xc, gates, merge, 1, hidden, 0, dxc, NULL, NULL);
}

// A dgates of the wrong width for the write variant.
static void scan_backward_write_with_short_dgates(void) {
    Ctx ctx = ctx_cpu();
    Tensor *xc = test_tensor(4, 1, 3, 4, 2), *gates = test_tensor(4, 1, 3, 4, 28);
    Tensor *merge = test_tensor(1, 4), *dyc = test_like(xc), *dgates = test_tensor(4, 1, 3, 4, 27);
    cpu_gspn_scan_bwd(&ctx, dyc, xc, gates, merge, 1, NULL, GSPN_SCAN_WRITE_GRADS, NULL, dgates, NULL);
}

// Each stops the program with a message naming the op, the argument and the shapes (run in a
// child process).
static void test_gspn_rejects_bad_shapes_with_a_message(void **state) {
    (void)state;
    expect_stop(scan_shared_with_per_channel_gates,
                (const char *[]){"gspn_scan_fwd", "gates have shape (1, 3, 4, 40)", "4*(2*Cc+3)", NULL});
    expect_stop(scan_backward_with_one_direction_of_hidden,
                (const char *[]){"gspn_scan_bwd", "hidden", "(4, B, H, W, Cc)", NULL});
    expect_stop(scan_backward_write_with_short_dgates,
                (const char *[]){"gspn_scan_bwd", "dgates has shape (1, 3, 4, 27)", NULL});
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gspn_forward_matches_naive_reference),
        cmocka_unit_test(test_gspn_tb_tiny_case_matches_hand_computed_values),
        cmocka_unit_test(test_gspn_constant_input_hidden_counts_scan_steps),
        cmocka_unit_test(test_gspn_backward_matches_finite_differences),
        cmocka_unit_test(test_gspn_backward_recompute_equals_saved_hidden),
        cmocka_unit_test(test_gspn_backward_accumulates_into_gradients),
        cmocka_unit_test(test_gspn_rejects_bad_shapes_with_a_message),
    };
    return cmocka_run_group_tests_name("gspn", tests, NULL, NULL);
}
