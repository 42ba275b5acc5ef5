// cuBLASLt GEMMs with a plan cache (kernels/cuda/cuda_gemm.h). A plan is the matmul descriptor,
// the three matrix layouts and the heuristic's algorithm for one key; building it costs a
// heuristic query (tens of microseconds of host time), so each key is queried once per context
// and every later call with that key only updates the bias/aux pointers and launches.
#include "cuda_gemm.h"
#include <stdint.h>
#include <string.h>

// Everything the algorithm choice depends on. All int64, so the struct has no padding and hashes
// and compares as bytes.
typedef struct GemmKey {
    int64_t trans_a, trans_b, m, n, k, lda, ldb, ldd, ldaux;
    int64_t ldc;     // a C operand apart from D (CudaGemm.c), else 0
    int64_t a_type, b_type, d_type, bias_type, epilogue;
    int64_t align;   // the bytes every pointer is aligned to (a power of two, 1..256)
} GemmKey;

typedef struct GemmPlan {
    GemmKey key;
    int used;
    int supported;   // 0: cuBLASLt has no algorithm for this key (remembered, not re-queried)
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld, lc;   // lc: C's layout (ld itself when C = D)
    cublasLtMatmulAlgo_t algo;
} GemmPlan;

struct CudaGemmCache {
    GemmPlan *plans;   // open addressing with linear probing; cap is a power of two
    int cap, count;
    long queries;      // heuristic queries made (one per key)
    long fused;        // launches with a non-default epilogue
    unsigned fusion;   // CUDA_FUSE_* allowed (cuda_gemm_set_fusion)
    int log;           // CGSPN_GEMM_LOG=1: print each plan as it is built (stderr)
    int tune;          // CGSPN_GEMM_TUNE=1: time the heuristic's candidates, keep the fastest
    void *scratch;     // cuda_gemm_scratch
    size_t scratch_bytes;
};

enum { GEMM_CACHE_INITIAL = 64 };

static CudaGemmCache *gemm_cache(Ctx *ctx) {
    CudaCtx *c = cuda_ctx_of(ctx);
    if (!c->gemm) {
        c->gemm = (CudaGemmCache *)cg_calloc(1, sizeof(CudaGemmCache));
        c->gemm->cap = GEMM_CACHE_INITIAL;
        c->gemm->plans = (GemmPlan *)cg_calloc(GEMM_CACHE_INITIAL, sizeof(GemmPlan));
        c->gemm->fusion = CUDA_FUSE_DEFAULT;
        const char *log = getenv("CGSPN_GEMM_LOG");
        c->gemm->log = log && log[0] == '1';
        const char *tune = getenv("CGSPN_GEMM_TUNE");
        c->gemm->tune = tune && tune[0] == '1';
        cuda_ctx_on_destroy(ctx, cuda_gemm_cache_destroy);
    }
    return c->gemm;
}

static uint64_t key_hash(const GemmKey *k) {   // FNV-1a over the key's bytes
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

// The slot holding key, or the empty slot where it goes.
static GemmPlan *cache_slot(GemmPlan *plans, int cap, const GemmKey *key) {
    for (uint64_t i = key_hash(key) & (uint64_t)(cap - 1);; i = (i + 1) & (uint64_t)(cap - 1))
        if (!plans[i].used || memcmp(&plans[i].key, key, sizeof *key) == 0) return &plans[i];
}

static void cache_grow(CudaGemmCache *s) {
    int cap = s->cap * 2;
    GemmPlan *plans = (GemmPlan *)cg_calloc((size_t)cap, sizeof(GemmPlan));
    for (int i = 0; i < s->cap; i++)
        if (s->plans[i].used) *cache_slot(plans, cap, &s->plans[i].key) = s->plans[i];
    free(s->plans);
    s->plans = plans;
    s->cap = cap;
}

static int epilogue_reads_bias(uint32_t e) {   // BIAS, *_BIAS, *_BGRAD, BGRADA, BGRADB
    return (e & CUBLASLT_EPILOGUE_BIAS) || (e & 16) || (e & CUBLASLT_EPILOGUE_BGRADA) ||
           (e & CUBLASLT_EPILOGUE_BGRADB);
}
static int epilogue_has_aux(uint32_t e) { return (e & 128) != 0; }   // *_AUX, DRELU, DGELU

// The CUDA_FUSE_* permissions an epilogue needs.
static unsigned epilogue_fusion(uint32_t e) {
    if (e == CUBLASLT_EPILOGUE_DEFAULT) return 0;
    if (e == CUBLASLT_EPILOGUE_DGELU_BGRAD) return CUDA_FUSE_DGELU | CUDA_FUSE_DGELU_BGRAD;
    unsigned need = 0;
    if (e & CUBLASLT_EPILOGUE_BIAS) need |= CUDA_FUSE_BIAS;
    if ((e & 16) || (e & CUBLASLT_EPILOGUE_BGRADA) || (e & CUBLASLT_EPILOGUE_BGRADB))
        need |= CUDA_FUSE_BIAS_GRAD;
    if (e & CUBLASLT_EPILOGUE_GELU) need |= CUDA_FUSE_GELU;
    if (e & 64) need |= CUDA_FUSE_DGELU;
    return need;
}

static const char *dtype_str(cudaDataType_t t) {
    return t == CUDA_R_16BF ? "bf16" : t == CUDA_R_32F ? "fp32" : "?";
}

static void gemm_describe(const CudaGemm *g, char *buf, size_t n) {
    snprintf(buf, n, "m=%d n=%d k=%d op(A)=%s op(B)=%s lda=%lld ldb=%lld ldd=%lld A %s B %s D %s "
             "epilogue %u", g->m, g->n, g->k, g->trans_a ? "T" : "N", g->trans_b ? "T" : "N",
             (long long)g->lda, (long long)g->ldb, (long long)g->ldd, dtype_str(g->a_type),
             dtype_str(g->b_type), dtype_str(g->d_type), (unsigned)g->epilogue);
}

// Sets the per-call pointers of the fused epilogue on the plan's descriptor.
static void plan_set_pointers(GemmPlan *p, const CudaGemm *g, uint32_t epi) {
    if (epilogue_reads_bias(epi))
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &g->bias, sizeof g->bias));
    if (epilogue_has_aux(epi))
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux, sizeof g->aux));
}

// CGSPN_GEMM_TUNE=1 (an experiment, not for runs that must resume bit-exactly: the pick can
// differ between processes): times each candidate on g's operands into a scratch D and returns
// the fastest one's index; prints the table on stderr.
static int plan_tune(CudaCtx *c, GemmPlan *p, const CudaGemm *g,
                     const cublasLtMatmulHeuristicResult_t *cand, int n) {
    size_t es = g->d_type == CUDA_R_16BF ? 2 : 4;
    void *d = cuda_malloc((size_t)g->ldd * g->n * es);
    CUDA_CHECK(cudaMemsetAsync(d, 0, (size_t)g->ldd * g->n * es, c->stream));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float alpha = 1.0f, beta = g->beta;
    int best = 0;
    double best_ms = 1e30, first_ms = 0;
    char buf[256];
    gemm_describe(g, buf, sizeof buf);
    fprintf(stderr, "cgspn gemm tune: %s:", buf);
    for (int i = 0; i < n; i++) {
        if (cand[i].state != CUBLAS_STATUS_SUCCESS || cand[i].workspaceSize > c->workspace_bytes) continue;
        float ms = 0;
        bool ok = true;
        for (int r = 0; r < 4 && ok; r++) {   // one warm-up, three timed
            if (r == 1) CUDA_CHECK(cudaEventRecord(e0, c->stream));
            ok = cublasLtMatmul(c->lt, p->desc, &alpha, g->a, p->la, g->b, p->lb, &beta,
                                g->c ? g->c : d, p->lc, d, p->ld, &cand[i].algo, c->workspace,
                                c->workspace_bytes, c->stream) == CUBLAS_STATUS_SUCCESS;
        }
        if (!ok) continue;
        CUDA_CHECK(cudaEventRecord(e1, c->stream));
        CUDA_CHECK(cudaEventSynchronize(e1));
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        ms /= 3;
        if (i == 0) first_ms = ms;
        fprintf(stderr, " #%d %.3f", i, ms);
        if (ms < best_ms) best_ms = ms, best = i;
    }
    fprintf(stderr, " ms -> #%d (%.1f%% of #0's time)\n", best, first_ms > 0 ? 100.0 * best_ms / first_ms : 0);
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    cuda_free(d);
    return best;
}

// Creates the descriptor and layouts for g and asks the heuristic for its best algorithm.
static void plan_build(CudaCtx *c, CudaGemmCache *s, GemmPlan *p, const CudaGemm *g, uint32_t epi,
                       uint32_t align) {
    cublasOperation_t ta = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (epilogue_reads_bias(epi)) {
        int32_t bt = (int32_t)g->bias_type;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                    &bt, sizeof bt));
    }
    if (epilogue_has_aux(epi)) {
        int64_t ld = g->ldaux;
        int32_t at = (int32_t)g->d_type;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                    &ld, sizeof ld));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &at, sizeof at));
    }
    plan_set_pointers(p, g, epi);   // the heuristic reads their alignment
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, g->a_type, g->trans_a ? g->k : g->m,
                                            g->trans_a ? g->m : g->k, g->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, g->b_type, g->trans_b ? g->n : g->k,
                                            g->trans_b ? g->k : g->n, g->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->ld, g->d_type, g->m, g->n, g->ldd));
    p->lc = p->ld;
    if (g->c) CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lc, g->d_type, g->m, g->n, g->ldc));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = c->workspace_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &ws, sizeof ws));
    const cublasLtMatmulPreferenceAttributes_t aligns[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &align, sizeof align));

    enum { TUNE_CANDIDATES = 16 };
    cublasLtMatmulHeuristicResult_t cand[TUNE_CANDIDATES];
    memset(cand, 0, sizeof cand);
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->la, p->lb, p->lc, p->ld,
                                                       pref, s->tune ? TUNE_CANDIDATES : 1, cand,
                                                       &found);
    cublasLtMatmulHeuristicResult_t res = cand[0];
    if (st == CUBLAS_STATUS_SUCCESS && s->tune && found > 1) res = cand[plan_tune(c, p, g, cand, found)];
    s->queries++;
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    char buf[256];
    gemm_describe(g, buf, sizeof buf);
    // A fused epilogue may be refused with NOT_SUPPORTED or INVALID_VALUE (unsupported type or
    // layout combination); the caller has an unfused path. A plain product must be supported.
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED &&
        epi == CUBLASLT_EPILOGUE_DEFAULT)
        cg_fail(__FILE__, __LINE__, "", "cuBLAS error %s in cublasLtMatmulAlgoGetHeuristic for %s",
                cublasLtGetStatusName(st), buf);
    p->supported = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (p->supported) p->algo = res.algo;
    if (s->log)
        fprintf(stderr, "cgspn gemm plan: %s align %u -> %s\n", buf, align,
                p->supported ? "algorithm found" : cublasLtGetStatusName(st));
}

static void plan_destroy(GemmPlan *p) {
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->la));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->ld));
    if (p->lc != p->ld) CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lc));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->desc));
}

// What g's product writes, marked written for compute-sanitizer (cuda_sanitize_mark_written): D
// unless it is also read (beta != 0 with C = D), a bias gradient, a GELU aux output. Column-major
// (m, n) with leading dimension ld spans (n - 1) ld + m elements.
static void sanitize_mark_outputs(Ctx *ctx, const CudaGemm *g, uint32_t epi) {
    const size_t es = g->d_type == CUDA_R_16BF ? 2 : 4;
    if (g->beta == 0.0f || (g->c && g->c != g->d))
        cuda_sanitize_mark_written(ctx, g->d, ((size_t)(g->n - 1) * g->ldd + g->m) * es);
    if (epi == CUBLASLT_EPILOGUE_BGRADA || epi == CUBLASLT_EPILOGUE_BGRADB)
        cuda_sanitize_mark_written(ctx, g->bias, (size_t)(epi == CUBLASLT_EPILOGUE_BGRADA ? g->m : g->n) *
                                                     (g->bias_type == CUDA_R_16BF ? 2 : 4));
    if (epi == CUBLASLT_EPILOGUE_GELU_AUX || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
        cuda_sanitize_mark_written(ctx, g->aux, ((size_t)(g->n - 1) * g->ldaux + g->m) * es);
}

extern "C" int cuda_gemm_try(Ctx *ctx, const CudaGemm *g) {
    CudaCtx *c = cuda_ctx_of(ctx);
    CudaGemmCache *s = gemm_cache(ctx);
    uint32_t epi = g->epilogue ? (uint32_t)g->epilogue : (uint32_t)CUBLASLT_EPILOGUE_DEFAULT;
    unsigned need = epilogue_fusion(epi), allowed = s->fusion;
    if (allowed & CUDA_FUSE_BIAS_GRAD_TALL && g->k >= CUDA_BGRAD_TALL_K && g->m >= CUDA_BGRAD_MIN_MN &&
        g->n >= CUDA_BGRAD_MIN_MN)
        allowed |= CUDA_FUSE_BIAS_GRAD;
    if ((need & allowed) != need) return 0;
    if (epilogue_has_aux(epi) && g->ldaux % 8 != 0) return 0;   // cuBLASLt: aux ld % 8 == 0
    if (g->m == 0 || g->n == 0) return 1;
    CG_CHECK(g->k > 0, "", "cuda_gemm: a product over k = 0 (m=%d n=%d)", g->m, g->n);

    uintptr_t bits = (uintptr_t)g->a | (uintptr_t)g->b | (uintptr_t)g->d | (uintptr_t)g->bias |
                     (uintptr_t)g->aux | (uintptr_t)g->c | (uintptr_t)256;
    uint32_t align = (uint32_t)(bits & (~bits + 1));   // lowest set bit: 1..256
    GemmKey key;
    memset(&key, 0, sizeof key);
    key.trans_a = g->trans_a != 0;
    key.trans_b = g->trans_b != 0;
    key.m = g->m; key.n = g->n; key.k = g->k;
    key.lda = g->lda; key.ldb = g->ldb; key.ldd = g->ldd;
    key.ldaux = epilogue_has_aux(epi) ? g->ldaux : 0;
    key.ldc = g->c ? g->ldc : 0;
    key.a_type = g->a_type; key.b_type = g->b_type; key.d_type = g->d_type;
    key.bias_type = epilogue_reads_bias(epi) ? g->bias_type : 0;
    key.epilogue = epi;
    key.align = align;

    if (2 * (s->count + 1) > s->cap) cache_grow(s);
    GemmPlan *p = cache_slot(s->plans, s->cap, &key);
    if (!p->used) {
        p->used = 1;
        p->key = key;
        s->count++;
        plan_build(c, s, p, g, epi, align);
    } else {
        plan_set_pointers(p, g, epi);
    }
    if (!p->supported) return 0;

    float alpha = 1.0f, beta = g->beta;
    sanitize_mark_outputs(ctx, g, epi);
    cublasStatus_t st = cublasLtMatmul(c->lt, p->desc, &alpha, g->a, p->la, g->b, p->lb, &beta,
                                       g->c ? g->c : g->d, p->lc, g->d, p->ld, &p->algo, c->workspace,
                                       c->workspace_bytes, c->stream);
    char buf[256];
    if (st == CUBLAS_STATUS_NOT_SUPPORTED && epi != CUBLASLT_EPILOGUE_DEFAULT) {
        p->supported = 0;   // the heuristic offered it but the launch refused: take the fallback
        if (s->log) {
            gemm_describe(g, buf, sizeof buf);
            fprintf(stderr, "cgspn gemm plan: %s refused at launch, unfused from now on\n", buf);
        }
        return 0;
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
        gemm_describe(g, buf, sizeof buf);
        cg_fail(__FILE__, __LINE__, "", "cuBLAS error %s in cublasLtMatmul for %s",
                cublasLtGetStatusName(st), buf);
    }
    if (epi != CUBLASLT_EPILOGUE_DEFAULT) s->fused++;
    return 1;
}

extern "C" void cuda_gemm(Ctx *ctx, const CudaGemm *g, const char *what) {
    if (cuda_gemm_try(ctx, g)) return;
    char buf[256];
    gemm_describe(g, buf, sizeof buf);
    CG_FAIL("", "%s: cuBLASLt has no algorithm for %s", what, buf);
}

extern "C" void cuda_gemm_set_fusion(Ctx *ctx, unsigned mask) { gemm_cache(ctx)->fusion = mask; }

extern "C" int cuda_gemm_fusion_allowed(Ctx *ctx, unsigned bits) {
    return (gemm_cache(ctx)->fusion & bits) == bits;
}

extern "C" void cuda_gemm_count_fused(Ctx *ctx) { gemm_cache(ctx)->fused++; }

extern "C" void *cuda_gemm_scratch(Ctx *ctx, size_t bytes) {
    CudaGemmCache *s = gemm_cache(ctx);
    if (bytes > s->scratch_bytes) {
        if (s->scratch) {   // earlier work on the stream may still read it
            CUDA_CHECK(cudaStreamSynchronize(cuda_stream_of(ctx)));
            cuda_free(s->scratch);
        }
        s->scratch_bytes = (bytes + 65535) / 65536 * 65536;
        s->scratch = cuda_malloc(s->scratch_bytes);
    }
    return s->scratch;
}

extern "C" void cuda_gemm_cache_stats(Ctx *ctx, int *plans, long *queries, long *fused_launches) {
    CudaGemmCache *s = gemm_cache(ctx);
    *plans = s->count;
    *queries = s->queries;
    *fused_launches = s->fused;
}

extern "C" void cuda_gemm_cache_destroy(Ctx *ctx) {
    CudaCtx *c = cuda_ctx_of(ctx);
    CudaGemmCache *s = c->gemm;
    if (!s) return;
    for (int i = 0; i < s->cap; i++)
        if (s->plans[i].used) plan_destroy(&s->plans[i]);
    free(s->plans);
    cuda_free(s->scratch);
    free(s);
    c->gemm = NULL;
}
