// cuDNN's fused flash attention through the backend API (cuDNN 9), for kernels/cuda/attention.cu.
// One operation graph per (B, N, heads, head_dim, direction), built on first use, its execution
// plan cached in the context; shapes cuDNN rejects are cached too, and the caller runs the
// fallback kernels for them.
//
// q, k, v are read in place from the packed qkv (B,N,3,H,D) through strided 4-D descriptors:
//   Q, V  dims (B,H,N,D)  strides (N*3C, D, 3C, 1), at qkv, qkv + 2C
//   K^T   dims (B,H,D,N)  strides (N*3C, D, 1, 3C), at qkv + C
//   O, dO dims (B,H,N,D)  strides (N*C, D, C, 1)
//   Stats dims (B,H,N,1)  strides (H*N, N, 1, 1) fp32 = our lse (B,H,N).
// cuDNN's Stats is max_j S_ij + log sum_j exp(S_ij - max) with S = scale Q K^T and the natural
// log: the log-sum-exp of the scaled scores, exactly ops.h's lse, so it is written and read as is.
//
// Forward graphs (tried in this order):
//   unified:   one SDPA_FWD operation (Q, K, V, O, Stats, scale), cuDNN >= 9.13.1.
//   composite: S = Q K^T; S *= scale; M = rowmax S; E = exp(S - M); Z = rowsum E;
//              Stats = M + log Z; P = E / Z (bf16); O = P V -- the pattern cuDNN's frontend
//              emits and the flash engine matches.
// Backward graphs (the frontend's composite SDPA backward, no mask or dropout; the unified
// SDPA_BWD operation as a last resort):
//   Dsum = rowsum(dO * O) (fp32, non-virtual, in the workspace);
//   P = exp(scale Q K^T - Stats); dV = P^T dO; dS = P * (dO V^T - Dsum) * scale;
//   dK = dS^T Q; dQ = dS K, through an fp32 dQ accumulator in the workspace (atomic adds:
//   "atomic" variant) or straight into dQ ("deterministic" variant, which the frontend builds
//   for deterministic requests and which may need a larger workspace).
// cuDNN overwrites dq, dk, dv; ops.h asks for +=, so they go to scratch laid out like dqkv and
// attn_accumulate adds them in.
#include "attention_internal.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CGSPN_HAVE_CUDNN
#include <cudnn.h>
#include <vector>

// Calls whose failure means cuDNN itself is broken (handle, execution): stop with the call, the
// status and cuDNN's last message.
#define CUDNN_CHECK(call)                                                                      \
    do {                                                                                       \
        cudnnStatus_t st_ = (call);                                                            \
        if (st_ != CUDNN_STATUS_SUCCESS) {                                                     \
            char msg_[512] = "";                                                               \
            cudnnGetLastErrorString(msg_, sizeof msg_);                                        \
            cg_fail(__FILE__, __LINE__, "run with CUDNN_LOGERR_DBG=1 for cuDNN's own log",     \
                    "cuDNN error %s in %s (%s:%d): %s", cudnnGetErrorString(st_), #call,       \
                    __FILE__, __LINE__, msg_);                                                 \
        }                                                                                      \
    } while (0)

// Calls while building a graph: the first failure is recorded (call, status, cuDNN's message)
// and later calls are skipped; the graph is then reported unsupported.
#define CUDNN_TRY(b, call) (b).check((b).ok ? (call) : CUDNN_STATUS_SUCCESS, #call)

namespace {

enum GraphKind { FWD_UNIFIED, FWD_COMPOSITE, BWD_DETERMINISTIC, BWD_ATOMIC, BWD_UNIFIED, GRAPH_KINDS };
const char *const KIND_NAME[GRAPH_KINDS] = {"unified SDPA forward", "composite SDPA forward",
                                            "composite SDPA backward, deterministic dQ",
                                            "composite SDPA backward, atomic dQ accumulator",
                                            "unified SDPA backward"};

// Tensor UIDs in the variant packs.
enum : int64_t {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_DO, UID_DQ, UID_DK, UID_DV,
    UID_ONE, UID_DSUM, UID_DQ_ACCUM,
    UID_VIRTUAL = 100   // and up: intermediates
};

// A workspace larger than this is not worth a deterministic backward; the atomic variant runs.
constexpr int64_t MAX_DETERMINISTIC_WORKSPACE = 4ll << 30;

// Descriptors of one graph, destroyed together (reverse order) when the cache goes.
struct Builder {
    std::vector<cudnnBackendDescriptor_t> owned, ops;
    bool ok = true;
    char err[400] = "";
    int64_t next_virtual = UID_VIRTUAL;

    bool check(cudnnStatus_t st, const char *call) {
        if (st == CUDNN_STATUS_SUCCESS || !ok) return ok;
        ok = false;
        char msg[256] = "";
        cudnnGetLastErrorString(msg, sizeof msg);
        snprintf(err, sizeof err, "%s: %s%s%s", call, cudnnGetErrorString(st), msg[0] ? ": " : "",
                 msg);
        return false;
    }
    cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type) {
        cudnnBackendDescriptor_t d = NULL;
        CUDNN_TRY(*this, cudnnBackendCreateDescriptor(type, &d));
        if (d) owned.push_back(d);
        return d;
    }
    void release() {
        for (size_t i = owned.size(); i-- > 0;) cudnnBackendDestroyDescriptor(owned[i]);
        owned.clear();
        ops.clear();
    }

    // A tensor of nd dims (4 but for scalars).
    cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t dt, const int64_t *dims,
                                    const int64_t *strides, bool is_virtual, int nd = 4,
                                    bool by_value = false) {
        cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        int64_t align = 16;
        CUDNN_TRY(*this, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE,
                                                  CUDNN_TYPE_DATA_TYPE, 1, &dt));
        CUDNN_TRY(*this, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64,
                                                  nd, dims));
        CUDNN_TRY(*this, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64,
                                                  nd, strides));
        CUDNN_TRY(*this, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64,
                                                  1, &uid));
        CUDNN_TRY(*this, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
                                                  CUDNN_TYPE_INT64, 1, &align));
        CUDNN_TRY(*this, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL,
                                                  CUDNN_TYPE_BOOLEAN, 1, &is_virtual));
        if (by_value)
            CUDNN_TRY(*this, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE,
                                                      CUDNN_TYPE_BOOLEAN, 1, &by_value));
        CUDNN_TRY(*this, cudnnBackendFinalize(t));
        return t;
    }
    // A by-value fp32 scalar (host memory, read at execute): rank 4 (all ones) as an operand of
    // pointwise operations, which take operands of equal rank; rank 1 for the SDPA operations.
    cudnnBackendDescriptor_t scalar(int64_t uid, int nd) {
        const int64_t ones[4] = {1, 1, 1, 1};
        return tensor(uid, CUDNN_DATA_FLOAT, ones, ones, false, nd, true);
    }
    // An fp32 (or dt) intermediate.
    cudnnBackendDescriptor_t virt(const int64_t *dims, const int64_t *strides,
                                  cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
        return tensor(next_virtual++, dt, dims, strides, true);
    }

    // y = mode(x[, b]) in fp32.
    void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                   cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y) {
        cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
        cudnnDataType_t prec = CUDNN_DATA_FLOAT;
        CUDNN_TRY(*this, cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE,
                                                  CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
        CUDNN_TRY(*this, cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MATH_PREC,
                                                  CUDNN_TYPE_DATA_TYPE, 1, &prec));
        CUDNN_TRY(*this, cudnnBackendFinalize(pw));
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
        CUDNN_TRY(*this, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw));
        CUDNN_TRY(*this, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
        if (b)
            CUDNN_TRY(*this, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
                                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
        CUDNN_TRY(*this, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
        CUDNN_TRY(*this, cudnnBackendFinalize(op));
        ops.push_back(op);
    }
    // y = reduce(x) over the dims where y is 1, in fp32.
    void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                   cudnnBackendDescriptor_t y) {
        cudnnBackendDescriptor_t rd = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
        cudnnDataType_t prec = CUDNN_DATA_FLOAT;
        CUDNN_TRY(*this, cudnnBackendSetAttribute(rd, CUDNN_ATTR_REDUCTION_OPERATOR,
                                                  CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode));
        CUDNN_TRY(*this, cudnnBackendSetAttribute(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE,
                                                  CUDNN_TYPE_DATA_TYPE, 1, &prec));
        CUDNN_TRY(*this, cudnnBackendFinalize(rd));
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
        CUDNN_TRY(*this, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd));
        CUDNN_TRY(*this, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
        CUDNN_TRY(*this, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
        CUDNN_TRY(*this, cudnnBackendFinalize(op));
        ops.push_back(op);
    }
    // c = a b (batched over the first two dims), fp32 accumulation.
    void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                cudnnBackendDescriptor_t c) {
        cudnnBackendDescriptor_t mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
        cudnnDataType_t prec = CUDNN_DATA_FLOAT;
        CUDNN_TRY(*this, cudnnBackendSetAttribute(mm, CUDNN_ATTR_MATMUL_COMP_TYPE,
                                                  CUDNN_TYPE_DATA_TYPE, 1, &prec));
        CUDNN_TRY(*this, cudnnBackendFinalize(mm));
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
        CUDNN_TRY(*this, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a));
        CUDNN_TRY(*this, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
        CUDNN_TRY(*this, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c));
        CUDNN_TRY(*this, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_DESC,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm));
        CUDNN_TRY(*this, cudnnBackendFinalize(op));
        ops.push_back(op);
    }
    // y = x seen with y's dims and strides (a transpose when the strides swap).
    void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
        CUDNN_TRY(*this, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
        CUDNN_TRY(*this, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
        CUDNN_TRY(*this, cudnnBackendFinalize(op));
        ops.push_back(op);
    }
};

// A built (or rejected) graph for one shape and kind.
struct Plan {
    long long key[6];             // B, N, H, D, dtype, kind
    bool supported = false;
    char note[512] = "";          // why unsupported, or which engine runs
    Builder b;                    // owns every descriptor, the plan last
    cudnnBackendDescriptor_t plan = NULL;
    int64_t workspace = 0;        // cuDNN's, bytes
    int64_t engine = -1;          // global engine index
    bool deterministic = true;    // the engine has no non-determinism note
    float scale = 1.0f, one = 1.0f;   // by-value operands (host memory read at execute)
};

}   // namespace

struct CudnnAttnCache {
    cudnnHandle_t handle = NULL;
    size_t version = 0;
    char broken[300] = "";   // why cuDNN cannot be used at all in this process (no handle)
    std::vector<Plan *> plans;
};

namespace {

CudnnAttnCache *cache_of(Ctx *ctx) {
    CudaAttnState *s = attn_state(ctx);
    if (!s->cudnn) {
        CudnnAttnCache *c = new CudnnAttnCache;
        // A cuDNN that cannot start (driver or library mismatch) leaves the fallback in charge.
        cudnnStatus_t st = cudnnCreate(&c->handle);
        if (st != CUDNN_STATUS_SUCCESS) {
            char msg[200] = "";
            cudnnGetLastErrorString(msg, sizeof msg);
            snprintf(c->broken, sizeof c->broken, "cudnnCreate: %s%s%s", cudnnGetErrorString(st),
                     msg[0] ? ": " : "", msg);
            c->handle = NULL;
        }
        c->version = cudnnGetVersion();
        s->cudnn = c;
    }
    return s->cudnn;
}

void dims4(int64_t *d, int64_t a, int64_t b, int64_t c, int64_t e) {
    d[0] = a; d[1] = b; d[2] = c; d[3] = e;
}

// The engine behind an engine config: its global index and whether it is marked
// non-deterministic.
void engine_info(Builder &b, cudnnBackendDescriptor_t cfg, int64_t *index, bool *deterministic) {
    cudnnBackendDescriptor_t engine = NULL;
    *index = -1;
    *deterministic = true;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) !=
        CUDNN_STATUS_SUCCESS)
        return;
    b.owned.push_back(engine);
    int64_t n = 0;
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                 1, &n, &engine) != CUDNN_STATUS_SUCCESS)
        return;
    cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, index);
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                 CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n,
                                 notes) == CUDNN_STATUS_SUCCESS)
        for (int64_t i = 0; i < n; i++)
            if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) *deterministic = false;
}

// The operation graph from b.ops, then the first engine config (heuristics mode A, then the
// fallback list) whose execution plan finalizes.
void finalize_plan(Plan *p, cudnnHandle_t handle) {
    Builder &b = p->b;
    cudnnBackendDescriptor_t graph = b.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    CUDNN_TRY(b, cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)b.ops.size(),
                                          b.ops.data()));
    CUDNN_TRY(b, cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
                                          CUDNN_TYPE_HANDLE, 1, &handle));
    CUDNN_TRY(b, cudnnBackendFinalize(graph));
    char last_plan_err[300] = "no engine config";
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int m = 0; m < 2 && b.ok && !p->plan; m++) {
        cudnnBackendDescriptor_t heur = b.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        CUDNN_TRY(b, cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph));
        CUDNN_TRY(b, cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE,
                                              CUDNN_TYPE_HEUR_MODE, 1, &modes[m]));
        CUDNN_TRY(b, cudnnBackendFinalize(heur));
        int64_t count = 0;
        CUDNN_TRY(b, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL));
        if (!b.ok || count <= 0) continue;
        std::vector<cudnnBackendDescriptor_t> cfgs(count);
        for (auto &c : cfgs) c = b.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        int64_t got = 0;
        CUDNN_TRY(b, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                              cfgs.data()));
        for (int64_t i = 0; i < got && b.ok && !p->plan; i++) {
            cudnnBackendDescriptor_t plan = b.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
            CUDNN_TRY(b, cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                                                  CUDNN_TYPE_HANDLE, 1, &handle));
            CUDNN_TRY(b, cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]));
            if (!b.ok) break;
            // An engine that cannot run this graph fails here; the next one is tried.
            cudnnStatus_t st = cudnnBackendFinalize(plan);
            if (st != CUDNN_STATUS_SUCCESS) {
                char msg[200] = "";
                cudnnGetLastErrorString(msg, sizeof msg);
                snprintf(last_plan_err, sizeof last_plan_err,
                         "cudnnBackendFinalize(execution plan): %s%s%s", cudnnGetErrorString(st),
                         msg[0] ? ": " : "", msg);
                continue;
            }
            int64_t n = 0;
            CUDNN_TRY(b, cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                  CUDNN_TYPE_INT64, 1, &n, &p->workspace));
            engine_info(b, cfgs[i], &p->engine, &p->deterministic);
            p->plan = plan;
        }
    }
    if (b.ok && !p->plan) {
        b.ok = false;
        snprintf(b.err, sizeof b.err, "no engine runs the graph (last: %s)", last_plan_err);
    }
}

// ---- the graphs ---------------------------------------------------------------------------------
struct Layout {   // dims and strides of the operands (see the header comment)
    int64_t q_dim[4], q_str[4], kt_dim[4], kt_str[4], o_str[4], st_dim[4], st_str[4];
    int64_t s_dim[4], s_str[4], st_t_str[4];   // scores (B,H,N,N), and their transpose
};

Layout layout_of(const AttnDims &a) {
    Layout L;
    int64_t B = a.B, N = a.N, H = a.H, D = a.D, C = a.C;
    dims4(L.q_dim, B, H, N, D);
    dims4(L.q_str, N * 3 * C, D, 3 * C, 1);
    dims4(L.kt_dim, B, H, D, N);
    dims4(L.kt_str, N * 3 * C, D, 1, 3 * C);
    dims4(L.o_str, N * C, D, C, 1);
    dims4(L.st_dim, B, H, N, 1);
    dims4(L.st_str, H * N, N, 1, 1);
    dims4(L.s_dim, B, H, N, N);
    dims4(L.s_str, H * N * N, N * N, N, 1);
    dims4(L.st_t_str, H * N * N, N * N, 1, N);
    return L;
}

void build_fwd_unified(Plan *p, const AttnDims &a) {
    Builder &b = p->b;
#if CUDNN_VERSION < 91301
    b.ok = false;
    snprintf(b.err, sizeof b.err, "built against cuDNN headers older than 9.13.1");
    (void)a;
#else
    Layout L = layout_of(a);
    const cudnnDataType_t io = CUDNN_DATA_BFLOAT16;
    auto q = b.tensor(UID_Q, io, L.q_dim, L.q_str, false);
    auto k = b.tensor(UID_K, io, L.q_dim, L.q_str, false);   // K as (B,H,N,D), like Q
    auto v = b.tensor(UID_V, io, L.q_dim, L.q_str, false);
    auto o = b.tensor(UID_O, io, L.q_dim, L.o_str, false);
    auto stats = b.tensor(UID_STATS, CUDNN_DATA_FLOAT, L.st_dim, L.st_str, false);
    auto scale = b.scalar(UID_SCALE, 1);
    auto op = b.make((cudnnBackendDescriptorType_t)CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR);
    const cudnnBackendAttributeName_t names[] = {
        CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC,
        CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC,
        CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC};
    cudnnBackendDescriptor_t descs[] = {q, k, v, o, stats, scale};
    for (int i = 0; i < 6; i++)
        CUDNN_TRY(b, cudnnBackendSetAttribute(op, names[i], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                              &descs[i]));
    CUDNN_TRY(b, cudnnBackendFinalize(op));
    b.ops.push_back(op);
#endif
}

void build_fwd_composite(Plan *p, const AttnDims &a) {
    Builder &b = p->b;
    Layout L = layout_of(a);
    const cudnnDataType_t io = CUDNN_DATA_BFLOAT16;
    auto q = b.tensor(UID_Q, io, L.q_dim, L.q_str, false);
    auto kt = b.tensor(UID_K, io, L.kt_dim, L.kt_str, false);
    auto v = b.tensor(UID_V, io, L.q_dim, L.q_str, false);
    auto o = b.tensor(UID_O, io, L.q_dim, L.o_str, false);
    auto stats = b.tensor(UID_STATS, CUDNN_DATA_FLOAT, L.st_dim, L.st_str, false);
    auto scale = b.scalar(UID_SCALE, 4);

    auto s = b.virt(L.s_dim, L.s_str);
    b.matmul(q, kt, s);                                   // S = Q K^T
    auto ss = b.virt(L.s_dim, L.s_str);
    b.pointwise(CUDNN_POINTWISE_MUL, s, scale, ss);       // S *= scale
    auto mx = b.virt(L.st_dim, L.st_str);
    b.reduction(CUDNN_REDUCE_TENSOR_MAX, ss, mx);         // M = rowmax S
    auto sub = b.virt(L.s_dim, L.s_str);
    b.pointwise(CUDNN_POINTWISE_SUB, ss, mx, sub);
    auto e = b.virt(L.s_dim, L.s_str);
    b.pointwise(CUDNN_POINTWISE_EXP, sub, NULL, e);       // E = exp(S - M)
    auto z = b.virt(L.st_dim, L.st_str);
    b.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);           // Z = rowsum E
    auto logz = b.virt(L.st_dim, L.st_str);
    b.pointwise(CUDNN_POINTWISE_LOG, z, NULL, logz);
    b.pointwise(CUDNN_POINTWISE_ADD, mx, logz, stats);    // Stats = M + log Z
    auto prob = b.virt(L.s_dim, L.s_str, io);
    b.pointwise(CUDNN_POINTWISE_DIV, e, z, prob);         // P = E / Z (bf16)
    b.matmul(prob, v, o);                                 // O = P V
}

void build_bwd(Plan *p, const AttnDims &a, bool deterministic, cudnnDataType_t k_view_type) {
    Builder &b = p->b;
    Layout L = layout_of(a);
    const cudnnDataType_t io = CUDNN_DATA_BFLOAT16;
    int64_t B = a.B, N = a.N, H = a.H, D = a.D;
    auto q = b.tensor(UID_Q, io, L.q_dim, L.q_str, false);
    auto kt = b.tensor(UID_K, io, L.kt_dim, L.kt_str, false);
    auto vt = b.tensor(UID_V, io, L.kt_dim, L.kt_str, false);   // V^T (B,H,D,N)
    auto o = b.tensor(UID_O, io, L.q_dim, L.o_str, false);
    auto dout = b.tensor(UID_DO, io, L.q_dim, L.o_str, false);
    auto stats = b.tensor(UID_STATS, CUDNN_DATA_FLOAT, L.st_dim, L.st_str, false);
    auto dq = b.tensor(UID_DQ, io, L.q_dim, L.q_str, false);    // scratch laid out like qkv
    auto dk = b.tensor(UID_DK, io, L.q_dim, L.q_str, false);
    auto dv = b.tensor(UID_DV, io, L.q_dim, L.q_str, false);
    auto scale = b.scalar(UID_SCALE, 4);
    auto one = b.scalar(UID_ONE, 4);
    auto dsum = b.tensor(UID_DSUM, CUDNN_DATA_FLOAT, L.st_dim, L.st_str, false);

    // Dsum = rowsum(dO * O)
    int64_t do_dim[4], do_str[4];
    dims4(do_dim, B, H, N, D);
    dims4(do_str, H * N * D, N * D, H * D, 1);
    auto dxo = b.virt(do_dim, do_str);
    b.pointwise(CUDNN_POINTWISE_MUL, dout, o, dxo);
    auto dsum_v = b.virt(L.st_dim, L.st_str);
    b.reduction(CUDNN_REDUCE_TENSOR_ADD, dxo, dsum_v);
    b.pointwise(CUDNN_POINTWISE_MUL, dsum_v, one, dsum);
    // P = exp(scale Q K^T - Stats); dV = P^T dO
    auto s = b.virt(L.s_dim, L.s_str);
    b.matmul(q, kt, s);
    auto ss = b.virt(L.s_dim, L.s_str);
    b.pointwise(CUDNN_POINTWISE_MUL, s, scale, ss);
    auto sub = b.virt(L.s_dim, L.s_str);
    b.pointwise(CUDNN_POINTWISE_SUB, ss, stats, sub);
    auto prob = b.virt(L.s_dim, L.s_str);
    b.pointwise(CUDNN_POINTWISE_EXP, sub, NULL, prob);
    auto prob_t = b.virt(L.s_dim, L.st_t_str, io);
    b.reshape(prob, prob_t);
    b.matmul(prob_t, dout, dv);
    // dS = P * (dO V^T - Dsum) * scale; dK = dS^T Q
    auto dp = b.virt(L.s_dim, L.s_str);
    b.matmul(dout, vt, dp);
    auto dp_sub = b.virt(L.s_dim, L.s_str);
    b.pointwise(CUDNN_POINTWISE_SUB, dp, dsum, dp_sub);
    auto ds_un = b.virt(L.s_dim, L.s_str);
    b.pointwise(CUDNN_POINTWISE_MUL, dp_sub, prob, ds_un);
    auto ds = b.virt(L.s_dim, L.s_str);
    b.pointwise(CUDNN_POINTWISE_MUL, ds_un, scale, ds);
    auto ds_t = b.virt(L.s_dim, L.st_t_str, io);
    b.reshape(ds, ds_t);
    b.matmul(ds_t, q, dk);
    // dQ = dS K (K as a view of K^T: fp32-typed, like every intermediate cuDNN's frontend leaves
    // untyped, unlike P^T and dS^T, which it types as the inputs; plan_for retries with bf16)
    auto k = b.virt(L.q_dim, L.q_str, k_view_type);
    b.reshape(kt, k);
    if (deterministic) {
        b.matmul(ds, k, dq);
    } else {
        int64_t acc_str[4];
        dims4(acc_str, H * N * D, N * D, D, 1);
        auto acc = b.tensor(UID_DQ_ACCUM, CUDNN_DATA_FLOAT, L.q_dim, acc_str, false);
        b.matmul(ds, k, acc);
        b.pointwise(CUDNN_POINTWISE_IDENTITY, acc, NULL, dq);
    }
}

// One SDPA_BWD operation (in cuDNN 9.19's headers, not in 9.14's; cuDNN's frontend does not use
// it yet): the last resort when the composite graphs are rejected.
void build_bwd_unified(Plan *p, const AttnDims &a) {
    Builder &b = p->b;
#if CUDNN_VERSION < 91900
    b.ok = false;
    snprintf(b.err, sizeof b.err, "built against cuDNN headers older than 9.19");
    (void)a;
#else
    Layout L = layout_of(a);
    const cudnnDataType_t io = CUDNN_DATA_BFLOAT16;
    auto q = b.tensor(UID_Q, io, L.q_dim, L.q_str, false);
    auto k = b.tensor(UID_K, io, L.q_dim, L.q_str, false);
    auto v = b.tensor(UID_V, io, L.q_dim, L.q_str, false);
    auto o = b.tensor(UID_O, io, L.q_dim, L.o_str, false);
    auto dout = b.tensor(UID_DO, io, L.q_dim, L.o_str, false);
    auto stats = b.tensor(UID_STATS, CUDNN_DATA_FLOAT, L.st_dim, L.st_str, false);
    auto dq = b.tensor(UID_DQ, io, L.q_dim, L.q_str, false);
    auto dk = b.tensor(UID_DK, io, L.q_dim, L.q_str, false);
    auto dv = b.tensor(UID_DV, io, L.q_dim, L.q_str, false);
    auto scale = b.scalar(UID_SCALE, 4);
    auto op = b.make((cudnnBackendDescriptorType_t)CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR);
    const cudnnBackendAttributeName_t names[] = {
        CUDNN_ATTR_OPERATION_SDPA_BWD_QDESC,     CUDNN_ATTR_OPERATION_SDPA_BWD_KDESC,
        CUDNN_ATTR_OPERATION_SDPA_BWD_VDESC,     CUDNN_ATTR_OPERATION_SDPA_BWD_ODESC,
        CUDNN_ATTR_OPERATION_SDPA_BWD_DODDESC,   CUDNN_ATTR_OPERATION_SDPA_BWD_STATSDESC,
        CUDNN_ATTR_OPERATION_SDPA_BWD_DQDESC,    CUDNN_ATTR_OPERATION_SDPA_BWD_DKDESC,
        CUDNN_ATTR_OPERATION_SDPA_BWD_DVDESC,    CUDNN_ATTR_OPERATION_SDPA_BWD_SCALEDESC};
    cudnnBackendDescriptor_t descs[] = {q, k, v, o, dout, stats, dq, dk, dv, scale};
    for (int i = 0; i < 10; i++)
        CUDNN_TRY(b, cudnnBackendSetAttribute(op, names[i], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                              &descs[i]));
    CUDNN_TRY(b, cudnnBackendFinalize(op));
    b.ops.push_back(op);
#endif
}

// The cached plan for (a, kind), built on first use.
Plan *plan_for(CudnnAttnCache *c, const AttnDims &a, GraphKind kind) {
    long long key[6] = {a.B, a.N, a.H, a.D, a.dtype, kind};
    for (Plan *p : c->plans)
        if (!memcmp(p->key, key, sizeof key)) return p;
    Plan *p = new Plan;
    memcpy(p->key, key, sizeof key);
    p->scale = a.scale;
    if ((kind == FWD_UNIFIED || kind == BWD_UNIFIED) && c->version < 91301) {
        snprintf(p->note, sizeof p->note, "%s: needs cuDNN >= 9.13.1", KIND_NAME[kind]);
    } else {
        auto attempt = [&](cudnnDataType_t k_view_type) {
            switch (kind) {
            case FWD_UNIFIED: build_fwd_unified(p, a); break;
            case FWD_COMPOSITE: build_fwd_composite(p, a); break;
            case BWD_DETERMINISTIC: build_bwd(p, a, true, k_view_type); break;
            case BWD_ATOMIC: build_bwd(p, a, false, k_view_type); break;
            default: build_bwd_unified(p, a); break;
            }
            if (p->b.ok) finalize_plan(p, c->handle);
        };
        attempt(CUDNN_DATA_FLOAT);
        if (!p->b.ok && (kind == BWD_DETERMINISTIC || kind == BWD_ATOMIC)) {
            char first[sizeof p->b.err];
            snprintf(first, sizeof first, "%s", p->b.err);
            p->b.release();
            p->b = Builder();
            attempt(CUDNN_DATA_BFLOAT16);
            if (!p->b.ok) {
                char second[sizeof p->b.err];
                snprintf(second, sizeof second, "%s", p->b.err);
                snprintf(p->b.err, sizeof p->b.err, "%.190s; with a bf16 K view: %.160s", first,
                         second);
            }
        }
        p->supported = p->b.ok;
        if (p->supported)
            snprintf(p->note, sizeof p->note, "%s, engine %lld%s, workspace %.1f MiB",
                     KIND_NAME[kind], (long long)p->engine,
                     p->deterministic ? "" : " (non-deterministic)", p->workspace / 1048576.0);
        else
            snprintf(p->note, sizeof p->note, "%s: %s", KIND_NAME[kind], p->b.err);
    }
    c->plans.push_back(p);
    return p;
}

// Runs the plan on n tensors. A failure (the call, status and cuDNN's message) marks the plan
// unsupported and returns false: the caller runs the fallback now, later calls another graph.
bool execute(CudnnAttnCache *c, Plan *p, int n, const int64_t *uids, void **ptrs, void *ws) {
    Builder run;
    cudnnBackendDescriptor_t pack = run.make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    CUDNN_TRY(run, cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                            CUDNN_TYPE_INT64, n, uids));
    CUDNN_TRY(run, cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                            CUDNN_TYPE_VOID_PTR, n, ptrs));
    CUDNN_TRY(run, cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                            CUDNN_TYPE_VOID_PTR, 1, &ws));
    CUDNN_TRY(run, cudnnBackendFinalize(pack));
    CUDNN_TRY(run, cudnnBackendExecute(c->handle, p->plan, pack));
    run.release();
    if (run.ok) return true;
    p->supported = false;
    snprintf(p->note, sizeof p->note, "%s: %s", KIND_NAME[p->key[5]], run.err);
    return false;
}

// Why cuDNN cannot take this call at all (NULL when it may).
const char *unsupported(const AttnDims &a, const void *const *ptrs, int n) {
    if (a.dtype != DTYPE_BF16) return "fp32 activations; cuDNN's fused attention takes bf16";
    if (a.D % 8 != 0) return "cuDNN's fused attention needs head_dim a multiple of 8";
    if (a.D > 256) return "cuDNN's fused attention takes head_dim <= 256";
    for (int i = 0; i < n; i++)
        if ((uintptr_t)ptrs[i] % 16 != 0) return "a tensor is not 16-byte aligned";
    return NULL;
}

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

}   // namespace

bool cudnn_attention_fwd(Ctx *ctx, const AttnDims &a, const void *qkv, void *out, float *lse,
                         char *why, size_t why_len) {
    const char *elt = (const char *)qkv;
    const void *ptrs[] = {qkv, elt + 2 * (size_t)a.C, out};
    if (const char *no = unsupported(a, ptrs, 3)) {
        snprintf(why, why_len, "%s", no);
        return false;
    }
    CudnnAttnCache *c = cache_of(ctx);
    if (c->broken[0]) {
        snprintf(why, why_len, "%s", c->broken);
        return false;
    }
    CUDNN_CHECK(cudnnSetStream(c->handle, cuda_stream_of(ctx)));
    // CGSPN_ATTN_FWD_GRAPH=composite skips the unified operation (to test or time the other).
    const char *pick = getenv("CGSPN_ATTN_FWD_GRAPH");
    const bool composite_only = pick && !strcmp(pick, "composite");
    Plan *p = plan_for(c, a, composite_only ? FWD_COMPOSITE : FWD_UNIFIED);
    if (!p->supported) {
        Plan *alt = plan_for(c, a, FWD_COMPOSITE);
        if (!alt->supported) {
            snprintf(why, why_len, "cuDNN rejects both forward graphs: %s; %s", p->note, alt->note);
            return false;
        }
        p = alt;
    }
    void *ws = attn_workspace(ctx, align256((size_t)p->workspace) + 256);
    const int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE};
    void *data[] = {(void *)qkv, (void *)(elt + 2 * (size_t)a.C), (void *)(elt + 4 * (size_t)a.C),
                    out, lse, &p->scale};
    cuda_sanitize_mark_written(ctx, out, (size_t)a.B * a.N * a.C * sizeof(__nv_bfloat16));
    cuda_sanitize_mark_written(ctx, lse, (size_t)a.B * a.H * a.N * sizeof(float));
    if (!execute(c, p, 6, uids, data, ws)) {
        snprintf(why, why_len, "%s", p->note);
        return false;
    }
    char ver[32];
    snprintf(why, why_len, "%s fused flash attention (%s)", cudnn_attention_version(ver, sizeof ver),
             p->note);
    return true;
}

bool cudnn_attention_bwd(Ctx *ctx, const AttnDims &a, const void *dout, const void *qkv,
                         const void *out, const float *lse, void *dqkv, bool write, char *why,
                         size_t why_len, int *deterministic) {
    const char *elt = (const char *)qkv;
    const void *ptrs[] = {qkv, elt + 2 * (size_t)a.C, out, dout, dqkv};
    if (const char *no = unsupported(a, ptrs, 5)) {
        snprintf(why, why_len, "%s", no);
        return false;
    }
    CudnnAttnCache *c = cache_of(ctx);
    if (c->broken[0]) {
        snprintf(why, why_len, "%s", c->broken);
        return false;
    }
    CUDNN_CHECK(cudnnSetStream(c->handle, cuda_stream_of(ctx)));
    // ctx->deterministic: the deterministic composite variant unless cuDNN rejects it or it needs
    // an outsized workspace; otherwise the atomic one first (as cuDNN's frontend does by
    // default). The unified SDPA_BWD operation is the last resort.
    const GraphKind det_order[] = {BWD_DETERMINISTIC, BWD_ATOMIC, BWD_UNIFIED};
    const GraphKind fast_order[] = {BWD_ATOMIC, BWD_DETERMINISTIC, BWD_UNIFIED};
    const GraphKind *order = ctx->deterministic ? det_order : fast_order;
    Plan *p = NULL;
    char skipped[1024] = "";
    for (int i = 0; i < 3 && !p; i++) {
        Plan *q = plan_for(c, a, order[i]);
        size_t used = strlen(skipped);
        if (!q->supported)
            snprintf(skipped + used, sizeof skipped - used, "; %s", q->note);
        else if (order[i] == BWD_DETERMINISTIC && q->workspace > MAX_DETERMINISTIC_WORKSPACE)
            snprintf(skipped + used, sizeof skipped - used,
                     "; not the deterministic variant: its workspace is %.1f GiB",
                     q->workspace / 1073741824.0);
        else
            p = q;
    }
    if (!p) {
        snprintf(why, why_len, "cuDNN rejects the backward graphs%s", skipped);
        return false;
    }
    const GraphKind kind = (GraphKind)p->key[5];
    const bool composite = kind != BWD_UNIFIED, atomic = kind == BWD_ATOMIC;
    const size_t tokens = (size_t)a.B * a.N;
    // write: dq, dk, dv go straight into dqkv (laid out as the scratch is), no scratch.
    const size_t scratch_bytes = write ? 0 : align256(tokens * 3 * a.C * sizeof(__nv_bfloat16));
    const size_t dsum_bytes = composite ? align256((size_t)a.B * a.H * a.N * sizeof(float)) : 0;
    const size_t acc_bytes = atomic ? align256(tokens * a.C * sizeof(float)) : 0;
    char *ws = (char *)attn_workspace(ctx, scratch_bytes + dsum_bytes + acc_bytes +
                                               align256((size_t)p->workspace) + 256);
    char *scratch = write ? (char *)dqkv : ws, *dsum = ws + scratch_bytes, *acc = dsum + dsum_bytes;
    char *cudnn_ws = acc + acc_bytes;
    if (atomic && c->version < 90600)   // older cuDNN leaves zeroing the accumulator to the caller
        CUDA_CHECK(cudaMemsetAsync(acc, 0, acc_bytes, cuda_stream_of(ctx)));
    // The graph's non-virtual tensors: the unified operation has the first 10, the composite
    // graphs add Dsum (and the dQ accumulator in the atomic variant).
    const size_t cb = (size_t)a.C * sizeof(__nv_bfloat16);
    const int64_t uids[] = {UID_Q,  UID_K,  UID_V,     UID_O,   UID_DO,   UID_STATS,   UID_DQ,
                            UID_DK, UID_DV, UID_SCALE, UID_ONE, UID_DSUM, UID_DQ_ACCUM};
    void *data[] = {(void *)qkv, (void *)(elt + cb), (void *)(elt + 2 * cb), (void *)out,
                    (void *)dout, (void *)lse, scratch, scratch + cb, scratch + 2 * cb,
                    &p->scale, &p->one, dsum, acc};
    cuda_sanitize_mark_written(ctx, scratch, tokens * 3 * cb);
    cuda_sanitize_mark_written(ctx, dsum, dsum_bytes);
    if (!execute(c, p, !composite ? 10 : atomic ? 13 : 12, uids, data, cudnn_ws)) {
        snprintf(why, why_len, "%s", p->note);
        return false;
    }
    if (!write) attn_accumulate(cuda_stream_of(ctx), DTYPE_BF16, scratch, dqkv, tokens * 3 * a.C);
    *deterministic = p->deterministic && !atomic;
    char ver[32];
    snprintf(why, why_len, "%s fused flash attention (%s)%s", cudnn_attention_version(ver, sizeof ver),
             p->note, skipped);
    return true;
}

void cudnn_attention_release(CudnnAttnCache *c) {
    if (!c) return;
    for (Plan *p : c->plans) {
        p->b.release();
        delete p;
    }
    if (c->handle) cudnnDestroy(c->handle);
    delete c;
}

const char *cudnn_attention_version(char *buf, size_t len) {
    size_t v = cudnnGetVersion();   // major*10000 + minor*100 + patch since cuDNN 9
    snprintf(buf, len, "cuDNN %zu.%zu.%zu", v / 10000, v / 100 % 100, v % 100);
    return buf;
}

#else   // no cuDNN in this build: every call takes the fallback

bool cudnn_attention_fwd(Ctx *, const AttnDims &, const void *, void *, float *, char *why,
                         size_t why_len) {
    snprintf(why, why_len, "this build has no cuDNN (see HAVE_CUDNN in build/config.mk)");
    return false;
}

bool cudnn_attention_bwd(Ctx *, const AttnDims &, const void *, const void *, const void *,
                         const float *, void *, bool, char *why, size_t why_len, int *) {
    snprintf(why, why_len, "this build has no cuDNN (see HAVE_CUDNN in build/config.mk)");
    return false;
}

void cudnn_attention_release(CudnnAttnCache *) {}

const char *cudnn_attention_version(char *buf, size_t len) {
    snprintf(buf, len, "no cuDNN in this build");
    return buf;
}

#endif

extern "C" int cuda_attention_built_with_cudnn(void) {
#ifdef CGSPN_HAVE_CUDNN
    return 1;
#else
    return 0;
#endif
}
