// Bucketed gradient averaging and the ZeRO-1 shard (dist/grads.h).
#include "grads.h"
#include "../kernels/ops.h"
#include "../kernels/error.h"
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(CGSPN_CUDA) && defined(CGSPN_HAVE_NCCL)
#define DIST_NCCL 1
#include <nccl.h>
#include "../kernels/cuda/cuda_common.h"
#endif

// ---- layout -------------------------------------------------------------------------------------

size_t dist_bucket_elems(double bucket_mb, int world) {
    const size_t unit = (size_t)world * DIST_ALIGN;
    size_t b = (size_t)(bucket_mb * 1048576.0 / sizeof(float) / (double)unit) * unit;
    return b < unit ? unit : b;
}

static int bucket_count(size_t total, size_t B) { return (int)((total + B - 1) / B); }

// Bucket k counts from the end of the buffer.
static void bucket_range(size_t total, size_t B, int k, size_t *lo, size_t *hi) {
    *hi = total - (size_t)k * B;
    *lo = *hi > B ? *hi - B : 0;
}

static int bucket_of(size_t total, size_t B, size_t elem) { return (int)((total - 1 - elem) / B); }

static size_t param_end(const Param *p) { return p->offset + p->value.numel; }

int dist_shard_segments(const ParamTable *t, size_t B, int world, int rank, ParamSegment **seg) {
    int cap = 16, n = 0;
    ParamSegment *s = cg_malloc((size_t)cap * sizeof *s);
    const int nb = bucket_count(t->total, B);
    int i = 0;   // parameters and buckets both walk the buffer from its start
    for (int k = nb - 1; k >= 0; k--) {
        size_t lo, hi, plo, phi;
        bucket_range(t->total, B, k, &lo, &hi);
        dist_part(hi - lo, world, rank, &plo, &phi);
        plo += lo;
        phi += lo;
        while (i < t->n && param_end(t->params[i]) <= plo) i++;
        for (int j = i; j < t->n && t->params[j]->offset < phi; j++) {
            const Param *p = t->params[j];
            size_t a = p->offset > plo ? p->offset : plo, b = param_end(p) < phi ? param_end(p) : phi;
            if (b <= a) continue;
            if (n && s[n - 1].param == j && s[n - 1].start + s[n - 1].len == a - p->offset) {
                s[n - 1].len += b - a;   // contiguous with the previous piece (a world of one)
                continue;
            }
            if (n == cap) s = cg_realloc(s, (size_t)(cap *= 2) * sizeof *s);
            s[n++] = (ParamSegment){j, a - p->offset, b - a, 0};
        }
    }
    *seg = s;
    return n;
}

Tensor dist_segment_view(const Tensor *x, size_t start, size_t len) {
    Tensor v = *x;
    v.grad = NULL;
    tensor_set_shape(&v, 1, (int[]){(int)len});
    v.data = (char *)x->data + start * dtype_size(x->dtype);
    return v;
}

// Readiness counts from the parameters' current trainable flags (they may change between
// stages: Stage 1 trains only the C-GSPN layers).
static void reset_step(DistGrads *g) {
    for (int k = 0; k < g->n_buckets; k++) {
        DistBucket *b = &g->buckets[k];
        b->pending = 0;
        for (int i = b->first; i >= 0 && i <= b->last; i++)
            if (g->t->params[i]->trainable && g->t->params[i]->value.numel) b->pending++;
        b->trainable = b->pending > 0;
        b->launched = false;
    }
    memset(g->ready, 0, (size_t)(g->t->n ? g->t->n : 1));
    g->next = 0;
    g->in_step = true;
}

static void bucket_what(const DistGrads *g, int k, const char *op, char *out, size_t n) {
    const DistBucket *b = &g->buckets[k];
    snprintf(out, n, "%s of gradient bucket %d of %d (%.1f MB)", op, k, g->n_buckets,
             (double)(b->hi - b->lo) * sizeof(float) / 1048576.0);
}

// ---- NCCL -----------------------------------------------------------------------------------------
#ifdef DIST_NCCL

typedef struct DistNccl {
    ncclComm_t comm;
    int device;
} DistNccl;

typedef struct DistGradsDevice {
    cudaStream_t stream;          // communication, apart from the context's main stream
    cudaEvent_t *ready, *done;    // per bucket (timing events: dist_grads_comm_profile)
    cudaEvent_t *start;           // per bucket: the communication stream reached its collective
    cudaEvent_t gather_ready, gather_done;
} DistGradsDevice;

#define NCCL_CHECK(d, call)                                                                     \
    do {                                                                                        \
        ncclResult_t r_ = (call);                                                               \
        if (r_ != ncclSuccess && r_ != ncclInProgress)                                          \
            dist_fail((d), "NCCL_DEBUG=WARN shows NCCL's view; check every rank sees its GPU",  \
                      "NCCL error in %s: %s (%s) (%s:%d)", #call, ncclGetErrorString(r_),       \
                      ncclGetLastError(NULL), __FILE__, __LINE__);                              \
    } while (0)

static void nccl_on_abort(Dist *d) {
    if (d->nccl) ncclCommAbort(d->nccl->comm);
}

static void nccl_on_finalize(Dist *d) {
    if (!d->nccl) return;
    dist_watch_begin(d, "ncclCommFinalize");
    NCCL_CHECK(d, ncclCommFinalize(d->nccl->comm));
    NCCL_CHECK(d, ncclCommDestroy(d->nccl->comm));
    dist_watch_end(d);
    free(d->nccl);
    d->nccl = NULL;
}

static DistNccl *nccl_comm(Dist *d, Ctx *ctx) {
    if (d->nccl) return d->nccl;
    // NVLink multicast (NVLS) stays off unless the user asks for it (dist/README.md).
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    // Peers connect at init, while every rank is known to be alive: with NCCL's default lazy
    // connection a collective's launch blocks on the CPU until each peer joins it, so a hung
    // peer would hang this rank inside ncclGroupEnd, before device_wait's deadline can act.
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (d->rank == 0) NCCL_CHECK(d, ncclGetUniqueId(&id));
    dist_broadcast(d, &id, sizeof id, 0, "the NCCL unique id broadcast");
    DistNccl *n = cg_calloc(1, sizeof *n);
    n->device = cuda_ctx_of(ctx)->device;
    CUDA_CHECK(cudaSetDevice(n->device));
    dist_watch_begin(d, "ncclCommInitRank");
    NCCL_CHECK(d, ncclCommInitRank(&n->comm, d->world, id, d->rank));
    dist_watch_end(d);
    d->nccl = n;
    d->on_abort = nccl_on_abort;
    d->on_finalize = nccl_on_finalize;
    return n;
}

static void nccl_grads_create(DistGrads *g) {
    nccl_comm(g->d, g->ctx);
    DistGradsDevice *v = cg_calloc(1, sizeof *v);
    // CGSPN_COMM_PRIORITY=high puts the collectives' stream above the compute stream, so the
    // scheduler hands NCCL's blocks the next free SMs instead of after the queued kernels.
    const char *prio = getenv("CGSPN_COMM_PRIORITY");
    CG_CHECK(!prio || !strcmp(prio, "high") || !strcmp(prio, "normal"), "high or normal",
             "CGSPN_COMM_PRIORITY=%s is not a priority", prio);
    int lowest = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &greatest));
    const int priority = prio && !strcmp(prio, "high") ? greatest : 0;
    CUDA_CHECK(cudaStreamCreateWithPriority(&v->stream, cudaStreamNonBlocking, priority));
    int nb = g->n_buckets ? g->n_buckets : 1;
    v->ready = cg_malloc((size_t)nb * sizeof(cudaEvent_t));
    v->done = cg_malloc((size_t)nb * sizeof(cudaEvent_t));
    v->start = cg_malloc((size_t)nb * sizeof(cudaEvent_t));
    for (int k = 0; k < nb; k++) {
        CUDA_CHECK(cudaEventCreate(&v->ready[k]));
        CUDA_CHECK(cudaEventCreate(&v->done[k]));
        CUDA_CHECK(cudaEventCreate(&v->start[k]));
    }
    CUDA_CHECK(cudaEventCreateWithFlags(&v->gather_ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&v->gather_done, cudaEventDisableTiming));
    g->dev = v;
}

static void nccl_grads_free(DistGrads *g) {
    DistGradsDevice *v = g->dev;
    if (!v) return;
    int nb = g->n_buckets ? g->n_buckets : 1;
    for (int k = 0; k < nb; k++) {
        cudaEventDestroy(v->ready[k]);
        cudaEventDestroy(v->done[k]);
        cudaEventDestroy(v->start[k]);
    }
    cudaEventDestroy(v->gather_ready);
    cudaEventDestroy(v->gather_done);
    cudaStreamDestroy(v->stream);
    free(v->ready);
    free(v->done);
    free(v->start);
    free(v);
    g->dev = NULL;
}

// Polls an event of the communication stream: NCCL's asynchronous errors and the deadline are
// checked while waiting (a peer that never joins leaves the collective spinning on the GPU).
static void device_wait(DistGrads *g, cudaEvent_t ev, const char *what) {
    Dist *d = g->d;
    const double t0 = dist_now();
    for (long spins = 0;; spins++) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) CUDA_CHECK(e);
        ncclResult_t async = ncclSuccess;
        NCCL_CHECK(d, ncclCommGetAsyncError(d->nccl->comm, &async));
        if (async != ncclSuccess && async != ncclInProgress)
            dist_fail(d, "NCCL_DEBUG=WARN shows NCCL's view", "NCCL failed during %s: %s (%s)", what,
                      ncclGetErrorString(async), ncclGetLastError(d->nccl->comm));
        double waited = dist_now() - t0;
        if (waited > d->timeout_s) {
            // NCCL cannot say whom it waits for: every rank that times out probes the others.
            char late[512];
            dist_describe_late(d, d->timeout_s < DIST_PROBE_GRACE_S ? d->timeout_s : DIST_PROBE_GRACE_S,
                               late, sizeof late);
            dist_fail(d, "a rank that stops answering is hung (a deadlock, a GPU fault) or dead; its "
                         "own log says which; raise dist_timeout_s if ranks legitimately wait this long",
                      "%s did not finish within %g s (dist_timeout_s); %s; aborting the NCCL "
                      "communicator and stopping the job", what, d->timeout_s, late);
        }
        if (spins > 2000) {
            struct timespec ts = {0, 20 * 1000};
            nanosleep(&ts, NULL);
        } else {
            sched_yield();
        }
    }
}

static ncclDataType_t nccl_dtype(DType dt) { return dt == DTYPE_BF16 ? ncclBfloat16 : ncclFloat; }

static void device_launch(DistGrads *g, int k) {
    Dist *d = g->d;
    DistGradsDevice *v = g->dev;
    ncclComm_t comm = d->nccl->comm;
    const DistBucket *b = &g->buckets[k];
    CUDA_CHECK(cudaEventRecord(v->ready[k], cuda_stream_of(g->ctx)));
    CUDA_CHECK(cudaStreamWaitEvent(v->stream, v->ready[k], 0));
    CUDA_CHECK(cudaEventRecord(v->start[k], v->stream));
    float *base = (float *)g->t->grads + b->lo;
    const size_t n = b->hi - b->lo;
    char what[160];   // the launch itself may block (a peer never connecting): watched
    bucket_what(g, k, g->zero ? "launching the reduce-scatter" : "launching the all-reduce",
                what, sizeof what);
    dist_watch_begin(d, what);
    NCCL_CHECK(d, ncclGroupStart());
    if (!g->zero) {
        NCCL_CHECK(d, ncclAllReduce(base, base, n, ncclFloat, ncclAvg, comm, v->stream));
    } else {
        size_t lo0, hi0;
        dist_part(n, d->world, 0, &lo0, &hi0);
        const size_t s = hi0 - lo0, even = s * (size_t)d->world;
        if (s)   // in place: rank r's part is base + r * s
            NCCL_CHECK(d, ncclReduceScatter(base, base + (size_t)d->rank * s, s, ncclFloat, ncclAvg,
                                            comm, v->stream));
        if (n > even)   // the remainder belongs to the last rank (dist_part)
            NCCL_CHECK(d, ncclReduce(base + even, base + even, n - even, ncclFloat, ncclAvg,
                                     d->world - 1, comm, v->stream));
    }
    NCCL_CHECK(d, ncclGroupEnd());
    dist_watch_end(d);
    CUDA_CHECK(cudaEventRecord(v->done[k], v->stream));
}

static void device_wait_all(DistGrads *g) {
    int last = -1;
    for (int k = 0; k < g->n_buckets; k++) {
        if (!g->buckets[k].launched || !g->buckets[k].trainable) continue;
        char what[160];
        bucket_what(g, k, g->zero ? "reduce-scatter" : "all-reduce", what, sizeof what);
        device_wait(g, g->dev->done[k], what);
        last = k;
    }
    if (last >= 0) CUDA_CHECK(cudaStreamWaitEvent(cuda_stream_of(g->ctx), g->dev->done[last], 0));
}

static void device_gather(DistGrads *g) {
    Dist *d = g->d;
    DistGradsDevice *v = g->dev;
    ncclComm_t comm = d->nccl->comm;
    const DType dt = g->t->dtype;
    const size_t es = dtype_size(dt);
    CUDA_CHECK(cudaEventRecord(v->gather_ready, cuda_stream_of(g->ctx)));
    CUDA_CHECK(cudaStreamWaitEvent(v->stream, v->gather_ready, 0));
    for (int k = 0; k < g->n_buckets; k++) {
        const DistBucket *b = &g->buckets[k];
        if (!b->trainable) continue;
        char *base = (char *)g->t->values + b->lo * es;
        const size_t n = b->hi - b->lo;
        size_t lo0, hi0;
        dist_part(n, d->world, 0, &lo0, &hi0);
        const size_t s = hi0 - lo0, even = s * (size_t)d->world;
        NCCL_CHECK(d, ncclGroupStart());
        if (s)
            NCCL_CHECK(d, ncclAllGather(base + (size_t)d->rank * s * es, base, s, nccl_dtype(dt), comm,
                                        v->stream));
        if (n > even)
            NCCL_CHECK(d, ncclBroadcast(base + even * es, base + even * es, n - even, nccl_dtype(dt),
                                        d->world - 1, comm, v->stream));
        NCCL_CHECK(d, ncclGroupEnd());
    }
    if (g->t->values_f32)   // kept-fp32 values: zeros but for each rank's pieces (train/optimizer.c)
        NCCL_CHECK(d, ncclAllReduce(g->t->values_f32, g->t->values_f32, g->t->total_f32, ncclFloat,
                                    ncclSum, comm, v->stream));
    CUDA_CHECK(cudaEventRecord(v->gather_done, v->stream));
    device_wait(g, v->gather_done, "the all-gather of updated parameters (zero = 1)");
    CUDA_CHECK(cudaStreamWaitEvent(cuda_stream_of(g->ctx), v->gather_done, 0));
}

static double event_ms(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

static bool device_comm_profile(const DistGrads *g, DistCommProfile *out) {
    const DistGradsDevice *v = g->dev;
    int last = -1;
    *out = (DistCommProfile){0};
    for (int k = 0; k < g->n_buckets; k++) {
        if (!g->buckets[k].launched || !g->buckets[k].trainable) continue;
        out->buckets++;
        out->busy_ms += event_ms(v->start[k], v->done[k]);
        double q = event_ms(v->ready[k], v->start[k]);
        if (q > out->queued_ms) out->queued_ms = q;
        last = k;
    }
    if (last < 0) return false;
    out->tail_ms = event_ms(v->ready[last], v->done[last]);
    return true;
}

#endif   // DIST_NCCL

static bool use_nccl(const DistGrads *g) {
#ifdef DIST_NCCL
    return g->ctx->device == DEVICE_CUDA;
#else
    (void)g;
    return false;
#endif
}

// ---- host paths ------------------------------------------------------------------------------------

// A range of a device buffer as a tensor (for the staging copies).
static Tensor range_tensor(const ParamTable *t, void *buf, DType dt, size_t lo, size_t n) {
    Tensor x = {0};
    tensor_set_shape(&x, 1, (int[]){(int)n});
    x.data = (char *)buf + lo * dtype_size(dt);
    x.dtype = dt;
    x.device = t->device;
    return x;
}

static void host_launch(DistGrads *g, int k) {
    const DistBucket *b = &g->buckets[k];
    const size_t n = b->hi - b->lo;
    char what[160];
    bucket_what(g, k, g->zero ? "reduce-scatter" : "all-reduce", what, sizeof what);
    float *buf = (float *)g->t->grads + b->lo;
    Tensor staged;
    if (g->t->device != DEVICE_CPU) {   // CUDA without NCCL: through host memory
        staged = range_tensor(g->t, g->t->grads, DTYPE_F32, b->lo, n);
        tensor_download(g->ctx, &staged, g->host);
        buf = g->host;
    }
    if (g->zero) dist_reduce_scatter_f32(g->d, buf, n, true, what);
    else dist_all_reduce_f32(g->d, buf, n, true, what);
    if (g->t->device != DEVICE_CPU) tensor_upload(g->ctx, &staged, g->host);
}

static void host_gather(DistGrads *g) {
    const DType dt = g->t->dtype;
    for (int k = 0; k < g->n_buckets; k++) {
        const DistBucket *b = &g->buckets[k];
        if (!b->trainable) continue;
        const size_t n = b->hi - b->lo;
        char what[160];
        bucket_what(g, k, "all-gather of updated parameters (zero = 1) in", what, sizeof what);
        void *buf = (char *)g->t->values + b->lo * dtype_size(dt);
        Tensor staged;
        if (g->t->device != DEVICE_CPU) {
            staged = range_tensor(g->t, g->t->values, dt, b->lo, n);
            tensor_download(g->ctx, &staged, g->host);
            buf = g->host;
        }
        dist_all_gather_parts(g->d, buf, n, dtype_size(dt), what);
        if (g->t->device != DEVICE_CPU) tensor_upload(g->ctx, &staged, g->host);
    }
    if (g->t->values_f32) {   // kept-fp32 values: zeros but for each rank's pieces (train/optimizer.c)
        Tensor kept = range_tensor(g->t, g->t->values_f32, DTYPE_F32, 0, g->t->total_f32);
        float *host = cg_malloc(g->t->total_f32 * sizeof(float));
        tensor_download(g->ctx, &kept, host);
        dist_all_reduce_f32(g->d, host, g->t->total_f32, false, "the sum of kept-fp32 parameters (zero = 1)");
        tensor_upload(g->ctx, &kept, host);
        free(host);
    }
}

// ---- the API ------------------------------------------------------------------------------------------

DistGrads *dist_grads_create(Dist *d, ParamTable *t, Ctx *ctx, int zero, double bucket_mb) {
    CG_CHECK(t->grads != NULL, "", "dist_grads_create: call params_alloc first");
    CG_CHECK(zero == 0 || zero == 1, "zero = 0 (replicated optimizer) or 1 (sharded)",
             "zero = %d is not supported", zero);
    DistGrads *g = cg_calloc(1, sizeof *g);
    g->d = d;
    g->t = t;
    g->ctx = ctx;
    g->zero = d->world > 1 ? zero : 0;
    const size_t unit = (size_t)d->world * DIST_ALIGN;
    g->bucket_elems = bucket_mb > 0 ? dist_bucket_elems(bucket_mb, d->world)
                                    : ((t->total + unit - 1) / unit) * unit;
    if (g->bucket_elems < unit) g->bucket_elems = unit;
    g->ready = cg_calloc((size_t)(t->n ? t->n : 1), 1);
    if (d->world <= 1 || t->total == 0) return g;

    const size_t B = g->bucket_elems;
    g->n_buckets = bucket_count(t->total, B);
    g->buckets = cg_calloc((size_t)g->n_buckets, sizeof(DistBucket));
    for (int k = 0; k < g->n_buckets; k++) {
        DistBucket *b = &g->buckets[k];
        bucket_range(t->total, B, k, &b->lo, &b->hi);
        b->first = b->last = -1;
        for (int i = 0; i < t->n; i++) {
            const Param *p = t->params[i];
            if (param_end(p) <= b->lo || p->offset >= b->hi || !p->value.numel) continue;
            if (b->first < 0) b->first = i;
            b->last = i;
        }
    }
    if (g->zero) {
        ParamSegment *seg;
        const int n = dist_shard_segments(t, B, d->world, d->rank, &seg);
        params_shard_state(t, ctx, seg, n);   // shard-size moments and masters from here on
        free(seg);
        g->seg = t->shard;
        g->n_seg = t->n_shard;
        for (int i = 0; i < g->n_seg; i++) g->shard_elems += g->seg[i].len;
    }
    if (use_nccl(g)) {
#ifdef DIST_NCCL
        nccl_grads_create(g);
#endif
    } else if (t->device != DEVICE_CPU) {
        g->host = cg_malloc(B * sizeof(float));
    }
    return g;
}

void dist_grads_free(DistGrads *g) {
    if (!g) return;
#ifdef DIST_NCCL
    nccl_grads_free(g);
#endif
    free(g->buckets);
    free(g->ready);
    free(g->host);
    free(g);
}

static void launch(DistGrads *g, int k) {
    DistBucket *b = &g->buckets[k];
    b->launched = true;
    if (!b->trainable) return;
#ifdef DIST_NCCL
    if (use_nccl(g)) {
        device_launch(g, k);
        return;
    }
#endif
    host_launch(g, k);
}

void dist_grad_ready(DistGrads *g, int param) {
    if (g->d->world <= 1) return;
    CG_CHECK(param >= 0 && param < g->t->n, "", "dist_grad_ready: parameter index %d of %d", param,
             g->t->n);
    const Param *p = g->t->params[param];
    if (!g->in_step) reset_step(g);
    if (!p->trainable || !p->value.numel) return;
    CG_CHECK(!g->ready[param], "a parameter's gradient is final once, after its last use in backward",
             "dist_grad_ready: %s reported ready twice in one step", p->name);
    g->ready[param] = 1;
    const size_t total = g->t->total, B = g->bucket_elems;
    for (int k = bucket_of(total, B, param_end(p) - 1); k <= bucket_of(total, B, p->offset); k++)
        g->buckets[k].pending--;
    while (g->next < g->n_buckets && g->buckets[g->next].pending == 0) launch(g, g->next++);
}

void dist_grad_ready_tensor(DistGrads *g, const Tensor *grad) {
    if (g->d->world <= 1) return;
    const char *base = g->t->grads, *at = grad->data;
    CG_CHECK(at >= base && at < base + g->t->total * sizeof(float), "",
             "dist_grad_ready_tensor: the tensor is not a gradient of this parameter table");
    size_t off = (size_t)(at - base) / sizeof(float);
    int lo = 0, hi = g->t->n - 1;   // the last parameter starting at or before off
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (g->t->params[mid]->offset <= off) lo = mid;
        else hi = mid - 1;
    }
    dist_grad_ready(g, lo);
}

void dist_wait_grads(DistGrads *g) {
    if (g->d->world <= 1) return;
    if (!g->in_step) reset_step(g);
    while (g->next < g->n_buckets) launch(g, g->next++);
#ifdef DIST_NCCL
    if (use_nccl(g)) device_wait_all(g);
#endif
    g->in_step = false;   // the next step starts from the trainable flags as they are then
}

bool dist_grads_comm_profile(const DistGrads *g, DistCommProfile *out) {
#ifdef DIST_NCCL
    if (g->d->world > 1 && use_nccl(g) && g->dev) return device_comm_profile(g, out);
#endif
    (void)g;
    *out = (DistCommProfile){0};
    return false;
}

void dist_gather_values(DistGrads *g) {
    if (g->d->world <= 1 || !g->zero) return;
#ifdef DIST_NCCL
    if (use_nccl(g)) {
        device_gather(g);
        return;
    }
#endif
    host_gather(g);
}
