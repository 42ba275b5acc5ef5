// libcgspn.so: the C ABI of kernels/cgspn.h over the C-GSPN scan and GSPN-1's gate recurrence.
//
// Every call checks all its arguments first and returns a status without writing anything when
// one is wrong; the library never exits. The CPU path runs the raw cores of kernels/cpu/
// gspn_scan.h and kernels/cpu/gate_recurrent.h (fp32, fp64; bf16 through fp32 copies) with
// workspace it allocates and checks itself. The CUDA path calls the op's CUDA kernels
// (kernels/ops.h) on the caller's stream, with a trap around them (kernels/error.h) that turns
// the framework's cg_fail into CGSPN_ERR_BACKEND; the gate recurrence's CUDA launchers
// (kernels/cuda/gate_recurrent.h) need no context and return their launch's error themselves.
// Both are weak references, so that a build without them links and reports
// CGSPN_ERR_UNSUPPORTED.
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "cgspn.h"
#include "ops.h"
#include "cpu/gspn_scan.h"
#include "cpu/gate_recurrent.h"
#include "error.h"
#ifdef CGSPN_CUDA
#include <pthread.h>
#include "cuda/cuda_common.h"
#include "cuda/gate_recurrent.h"
#endif

// ---- errors ------------------------------------------------------------------------------------

static _Thread_local char last_error[512];

static int fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

CGSPN_API int cgspn_abi_version(void) { return CGSPN_ABI_VERSION; }

CGSPN_API const char *cgspn_status_string(int status) {
    switch (status) {
    case CGSPN_OK: return "success";
    case CGSPN_ERR_NULL_POINTER: return "a required pointer is NULL";
    case CGSPN_ERR_BAD_SHAPE:
        return "bad shape: B, H, W and Cc must be >= 1 and the sizes fit in memory";
    case CGSPN_ERR_BAD_DTYPE: return "unknown dtype (expected CGSPN_DTYPE_F32, _BF16 or _F64)";
    case CGSPN_ERR_BAD_DEVICE:
        return "unknown device, or a pointer that is not memory of the device";
    case CGSPN_ERR_BAD_ARGUMENT: return "bad argument: shared_w and grad_mode must be 0 or 1";
    case CGSPN_ERR_UNSUPPORTED: return "not supported by this build or device";
    case CGSPN_ERR_OUT_OF_MEMORY: return "out of host memory for workspace";
    case CGSPN_ERR_CUDA: return "a CUDA runtime call failed";
    case CGSPN_ERR_BACKEND: return "the backend kernel stopped with an error";
    default: return "unknown status";
    }
}

CGSPN_API const char *cgspn_last_error(void) { return last_error; }

// ---- one call, checked -------------------------------------------------------------------------

typedef struct Call {
    int device, dtype, shared_w, grad_mode, backward;
    void *stream;
    GspnShape sh;
    size_t plane, gates_n;                  // elements of xc and of gates
    size_t io_size, acc_size;               // bytes of an xc/gates element, of merge/hidden's
    const void *dyc, *xc, *gates, *merge;
    void *hidden;                           // written by the forward, read by the backward
    void *yc, *dxc, *dgates, *dmerge;
} Call;

// The arguments every function takes: device, dtype and, for a backward, grad_mode.
static int check_common(const char *fn, int device, int dtype, int backward, int grad_mode) {
    if (device != CGSPN_DEVICE_CPU && device != CGSPN_DEVICE_CUDA)
        return fail(CGSPN_ERR_BAD_DEVICE, "%s: device %d is neither CGSPN_DEVICE_CPU (0) nor "
                    "CGSPN_DEVICE_CUDA (1)", fn, device);
    if (dtype != CGSPN_DTYPE_F32 && dtype != CGSPN_DTYPE_BF16 && dtype != CGSPN_DTYPE_F64)
        return fail(CGSPN_ERR_BAD_DTYPE, "%s: dtype %d is not CGSPN_DTYPE_F32 (0), _BF16 (1) or "
                    "_F64 (2)", fn, dtype);
    if (backward && grad_mode != CGSPN_GRAD_OVERWRITE && grad_mode != CGSPN_GRAD_ACCUMULATE)
        return fail(CGSPN_ERR_BAD_ARGUMENT, "%s: grad_mode = %d, expected CGSPN_GRAD_OVERWRITE (0) "
                    "or CGSPN_GRAD_ACCUMULATE (1)", fn, grad_mode);
    return CGSPN_OK;
}

static int call_check(Call *c, int B, int H, int W, int Cc) {
    const char *fn = c->backward ? "cgspn_gspn_scan_bwd" : "cgspn_gspn_scan_fwd";
    const int status = check_common(fn, c->device, c->dtype, c->backward, c->grad_mode);
    if (status != CGSPN_OK) return status;
    if (c->shared_w != 0 && c->shared_w != 1)
        return fail(CGSPN_ERR_BAD_ARGUMENT, "%s: shared_w = %d, expected 0 or 1", fn, c->shared_w);
    if (B < 1 || H < 1 || W < 1 || Cc < 1)
        return fail(CGSPN_ERR_BAD_SHAPE, "%s: (B, H, W, Cc) = (%d, %d, %d, %d); each must be >= 1",
                    fn, B, H, W, Cc);

    // Sizes: G and 4*B are ints in the cores; no byte count may pass PTRDIFF_MAX.
    c->io_size = c->dtype == CGSPN_DTYPE_F64 ? 8 : c->dtype == CGSPN_DTYPE_BF16 ? 2 : 4;
    c->acc_size = c->dtype == CGSPN_DTYPE_F64 ? 8 : 4;
    const size_t G = c->shared_w ? 4 * (2 * (size_t)Cc + 3) : 20 * (size_t)Cc;
    size_t tokens, plane, gates_n, hidden_bytes, gates_bytes;
    const size_t max_bytes = PTRDIFF_MAX;
    if (Cc > (INT_MAX - 12) / 20 || B > INT_MAX / GSPN_DIRS ||
        __builtin_mul_overflow((size_t)B, (size_t)H, &tokens) ||
        __builtin_mul_overflow(tokens, (size_t)W, &tokens) ||
        __builtin_mul_overflow(tokens, (size_t)Cc, &plane) ||
        __builtin_mul_overflow(tokens, G, &gates_n) ||
        __builtin_mul_overflow(plane, (size_t)GSPN_DIRS * 8, &hidden_bytes) ||
        __builtin_mul_overflow(gates_n, (size_t)8, &gates_bytes) ||
        hidden_bytes > max_bytes || gates_bytes > max_bytes)
        return fail(CGSPN_ERR_BAD_SHAPE, "%s: (B, H, W, Cc) = (%d, %d, %d, %d) is too large to "
                    "address", fn, B, H, W, Cc);
    c->sh = gspn_shape_make(B, H, W, Cc, c->shared_w);
    c->plane = plane;
    c->gates_n = gates_n;

    // Pointers: inputs always; yc for the forward; dyc when backward has anything to do.
    const int any_grad = c->dxc || c->dgates || c->dmerge;
    const char *missing = !c->xc ? "xc" : !c->gates ? "gates" : !c->merge ? "merge"
                        : !c->backward && !c->yc ? "yc"
                        : c->backward && any_grad && !c->dyc ? "dyc" : NULL;
    if (missing) return fail(CGSPN_ERR_NULL_POINTER, "%s: %s is NULL", fn, missing);

    if (c->device == CGSPN_DEVICE_CUDA && c->dtype == CGSPN_DTYPE_F64)
        return fail(CGSPN_ERR_UNSUPPORTED, "%s: fp64 runs on the CPU only (use it as a reference); "
                    "CUDA takes CGSPN_DTYPE_F32 or _BF16", fn);
    return CGSPN_OK;
}

// ---- CPU ---------------------------------------------------------------------------------------

// Host workspace of one call: every block is allocated before any output is written, so running
// out of memory leaves the outputs as they were.
#define SCRATCH_MAX 16   // blocks a call holds at most (the gate recurrence's bf16 backward: 13)
typedef struct Scratch {
    void *block[SCRATCH_MAX];
    int n, failed;
} Scratch;

static void *scratch_alloc(Scratch *s, size_t bytes, int zero) {
    void *p = s->n < SCRATCH_MAX ? (zero ? calloc(1, bytes) : malloc(bytes)) : NULL;
    if (!p) {
        s->failed = 1;
        return NULL;
    }
    s->block[s->n++] = p;
    return p;
}

static void scratch_free(Scratch *s) {
    for (int i = 0; i < s->n; i++) free(s->block[i]);
    s->n = 0;
}

static int scratch_oom(Scratch *s, const char *fn) {
    scratch_free(s);
    return fail(CGSPN_ERR_OUT_OF_MEMORY, "%s: out of host memory for workspace", fn);
}

// An fp32 copy of n bf16 values in the workspace (NULL when it could not be allocated).
static float *scratch_widen(Scratch *s, const void *bf16, size_t n) {
    float *f = scratch_alloc(s, n * sizeof(float), 0);
    if (!f) return NULL;
    const uint16_t *v = bf16;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) f[i] = bf16_to_f32(v[i]);
    return f;
}

// out (bf16) = round(value) or round(out + value).
static void narrow_store(void *out, const float *value, size_t n, int accumulate) {
    uint16_t *o = out;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        o[i] = f32_to_bf16(accumulate ? bf16_to_f32(o[i]) + value[i] : value[i]);
}

static int cpu_forward(const Call *c) {
    const int bf16 = c->dtype == CGSPN_DTYPE_BF16, f64 = c->dtype == CGSPN_DTYPE_F64;
    Scratch s = {0};
    const void *xc = c->xc, *gates = c->gates;
    void *yc = c->yc, *h = c->hidden;
    if (bf16) {
        xc = scratch_widen(&s, c->xc, c->plane);
        gates = scratch_widen(&s, c->gates, c->gates_n);
        yc = scratch_alloc(&s, c->plane * sizeof(float), 0);
    }
    if (!h) h = scratch_alloc(&s, GSPN_DIRS * c->plane * c->acc_size, 0);
    if (s.failed) return scratch_oom(&s, "cgspn_gspn_scan_fwd");

    if (f64)
        gspn_core_fwd_f64(&c->sh, xc, gates, c->merge, yc, h);
    else
        gspn_core_fwd_f32(&c->sh, xc, gates, c->merge, yc, h);
    if (bf16) narrow_store(c->yc, yc, c->plane, 0);
    scratch_free(&s);
    return CGSPN_OK;
}

static int cpu_backward(const Call *c) {
    const int bf16 = c->dtype == CGSPN_DTYPE_BF16, f64 = c->dtype == CGSPN_DTYPE_F64;
    const int overwrite = c->grad_mode == CGSPN_GRAD_OVERWRITE;
    Scratch s = {0};
    const void *dyc = c->dyc, *xc = c->xc, *gates = c->gates, *h = c->hidden;
    void *dxc = c->dxc, *dgates = c->dgates, *h_own = NULL;
    if (bf16) {   // the gradients go to zeroed fp32 blocks, then into the bf16 outputs
        dyc = scratch_widen(&s, c->dyc, c->plane);
        xc = scratch_widen(&s, c->xc, c->plane);
        gates = scratch_widen(&s, c->gates, c->gates_n);
        if (c->dxc) dxc = scratch_alloc(&s, c->plane * sizeof(float), 1);
        if (c->dgates) dgates = scratch_alloc(&s, c->gates_n * sizeof(float), 1);
    }
    if (!h) h = h_own = scratch_alloc(&s, GSPN_DIRS * c->plane * c->acc_size, 0);
    void *dh = scratch_alloc(&s, GSPN_DIRS * c->plane * c->acc_size, 0);
    double *dmerge_part = scratch_alloc(&s, (size_t)GSPN_DIRS * c->sh.B * sizeof(double), 0);
    if (s.failed) return scratch_oom(&s, "cgspn_gspn_scan_bwd");

    if (overwrite) {
        if (c->dmerge) memset(c->dmerge, 0, GSPN_DIRS * c->acc_size);
        if (!bf16 && dxc) memset(dxc, 0, c->plane * c->io_size);
        if (!bf16 && dgates) memset(dgates, 0, c->gates_n * c->io_size);
    }
    if (f64) {
        if (h_own) gspn_core_hidden_f64(&c->sh, xc, gates, h_own);
        gspn_core_bwd_f64(&c->sh, dyc, xc, gates, c->merge, h, dh, dmerge_part, dxc, dgates,
                          c->dmerge);
    } else {
        if (h_own) gspn_core_hidden_f32(&c->sh, xc, gates, h_own);
        gspn_core_bwd_f32(&c->sh, dyc, xc, gates, c->merge, h, dh, dmerge_part, dxc, dgates,
                          c->dmerge);
    }
    if (bf16 && c->dxc) narrow_store(c->dxc, dxc, c->plane, !overwrite);
    if (bf16 && c->dgates) narrow_store(c->dgates, dgates, c->gates_n, !overwrite);
    scratch_free(&s);
    return CGSPN_OK;
}

// ---- CUDA --------------------------------------------------------------------------------------
#ifdef CGSPN_CUDA
// Weak and hidden: resolved when this library (or binary) is linked, never by another library
// loaded into the same process.
#define CGSPN_WEAK __attribute__((weak, visibility("hidden")))
extern __typeof__(cpu_gspn_scan_fwd) cuda_gspn_scan_fwd CGSPN_WEAK;
extern __typeof__(cpu_gspn_scan_bwd) cuda_gspn_scan_bwd CGSPN_WEAK;
extern __typeof__(cuda_gate_recurrent_fwd) cuda_gate_recurrent_fwd CGSPN_WEAK;
extern __typeof__(cuda_gate_recurrent_bwd) cuda_gate_recurrent_bwd CGSPN_WEAK;

static int cuda_kernels_linked(void) { return cuda_gspn_scan_fwd && cuda_gspn_scan_bwd; }

// Runs fn(arg) with cg_fail trapped: a failure inside the framework's code comes back as
// CGSPN_ERR_BACKEND with its message. The trap lives in thread storage (not on this frame) so its
// message is well defined after the longjmp. Calls do not nest.
typedef int (*TrappedFn)(void *arg);
static _Thread_local CgTrap call_trap;

static int trapped(TrappedFn fn, void *arg) {
    CgTrap *outer = cg_trap_set(&call_trap);
    if (setjmp(call_trap.env)) {
        cg_trap_set(outer);
        return fail(CGSPN_ERR_BACKEND, "%s", call_trap.message);
    }
    const int status = fn(arg);
    cg_trap_set(outer);
    return status;
}

// The device of a CUDA buffer; CGSPN_ERR_BAD_DEVICE for host memory.
static int cuda_buffer_device(const char *fn, const char *name, const void *p, int *device) {
    struct cudaPointerAttributes attr;
    cudaError_t err = cudaPointerGetAttributes(&attr, p);
    if (err == cudaErrorInvalidValue) {       // CUDA < 11 reports host memory this way
        cudaGetLastError();
        return fail(CGSPN_ERR_BAD_DEVICE, "%s: %s (%p) is not CUDA device memory", fn, name, p);
    }
    if (err != cudaSuccess) {
        cudaGetLastError();
        return fail(CGSPN_ERR_CUDA, "%s: cudaPointerGetAttributes(%s) failed: %s", fn, name,
                    cudaGetErrorString(err));
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
        return fail(CGSPN_ERR_BAD_DEVICE, "%s: %s (%p) is host memory; device = CGSPN_DEVICE_CUDA "
                    "takes device pointers", fn, name, p);
    *device = attr.device;
    return CGSPN_OK;
}

// The GPU that holds every non-NULL buffer of ptrs (n of them, named in names for the messages),
// made the calling thread's current device; *previous receives the device that was current, which
// the caller restores (cudaSetDevice(*previous)) when the call is done. The first non-NULL buffer
// sets the GPU the others must be on.
static int cuda_enter(const char *fn, int n, const char *const *names, const void *const *ptrs,
                      int *device, int *previous) {
    int first = -1;
    *device = -1;
    for (int i = 0; i < n; i++) {
        if (!ptrs[i]) continue;
        int d = -1;
        const int status = cuda_buffer_device(fn, names[i], ptrs[i], &d);
        if (status != CGSPN_OK) return status;
        if (first >= 0 && d != *device)
            return fail(CGSPN_ERR_BAD_DEVICE, "%s: %s is on GPU %d, %s on GPU %d", fn, names[i], d,
                        names[first], *device);
        if (first < 0) first = i;
        *device = d;
    }
    cudaError_t err = cudaGetDevice(previous);
    if (err == cudaSuccess) err = cudaSetDevice(*device);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return fail(CGSPN_ERR_CUDA, "%s: selecting GPU %d failed: %s", fn, *device,
                    cudaGetErrorString(err));
    }
    return CGSPN_OK;
}

// Contexts (side streams, events, handles) for the kernels, one per concurrent call and device,
// created on first need and kept for the process. A call takes one, runs with the caller's stream
// in a copy of it, and gives it back.
typedef struct PoolCtx {
    Ctx ctx;
    int device, busy;
    struct PoolCtx *next;
} PoolCtx;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static PoolCtx *pool_head;

static int pool_create(void *arg) {
    PoolCtx *p = arg;
    p->ctx = cuda_ctx_create(p->device, DTYPE_F32);
    return CGSPN_OK;
}

static int pool_take(int device, PoolCtx **out) {
    pthread_mutex_lock(&pool_lock);
    for (PoolCtx *p = pool_head; p; p = p->next)
        if (!p->busy && p->device == device) {
            p->busy = 1;
            pthread_mutex_unlock(&pool_lock);
            *out = p;
            return CGSPN_OK;
        }
    pthread_mutex_unlock(&pool_lock);
    PoolCtx *p = calloc(1, sizeof *p);
    if (!p) return fail(CGSPN_ERR_OUT_OF_MEMORY, "out of host memory for a CUDA context");
    p->device = device;
    p->busy = 1;
    const int status = trapped(pool_create, p);   // on failure its partial resources leak
    if (status != CGSPN_OK) {
        free(p);
        return status;
    }
    pthread_mutex_lock(&pool_lock);
    p->next = pool_head;
    pool_head = p;
    pthread_mutex_unlock(&pool_lock);
    *out = p;
    return CGSPN_OK;
}

static void pool_give(PoolCtx *p) {
    pthread_mutex_lock(&pool_lock);
    p->busy = 0;
    pthread_mutex_unlock(&pool_lock);
}

static Tensor cuda_tensor(const void *data, DType dtype, int ndim, const int *shape) {
    Tensor t = {.data = (void *)data, .ndim = ndim, .numel = 1, .dtype = dtype,
                .device = DEVICE_CUDA};
    for (int i = 0; i < TENSOR_MAX_DIMS; i++) t.shape[i] = i < ndim ? shape[i] : 1;
    for (int i = 0; i < ndim; i++) t.numel *= (size_t)shape[i];
    return t;
}

typedef struct CudaLaunch {
    const Call *call;
    PoolCtx *pool;
} CudaLaunch;

static int cuda_launch(void *arg) {
    const CudaLaunch *l = arg;
    const Call *c = l->call;
    CudaCtx cc = *cuda_ctx_of(&l->pool->ctx);
    cc.stream = (cudaStream_t)c->stream;
    const DType io = c->dtype == CGSPN_DTYPE_BF16 ? DTYPE_BF16 : DTYPE_F32;
    Ctx ctx = l->pool->ctx;
    ctx.cuda = &cc;
    ctx.act_dtype = io;

    const GspnShape *sh = &c->sh;
    const int tok_shape[4] = {sh->B, sh->H, sh->W, sh->Cc};
    const int gate_shape[4] = {sh->B, sh->H, sh->W, sh->G};
    const int hid_shape[5] = {GSPN_DIRS, sh->B, sh->H, sh->W, sh->Cc};
    const int merge_shape[1] = {GSPN_DIRS};
    Tensor xc = cuda_tensor(c->xc, io, 4, tok_shape);
    Tensor gates = cuda_tensor(c->gates, io, 4, gate_shape);
    Tensor merge = cuda_tensor(c->merge, DTYPE_F32, 1, merge_shape);
    Tensor hidden = cuda_tensor(c->hidden, DTYPE_F32, 5, hid_shape);
    Tensor *hid = c->hidden ? &hidden : NULL;
    if (!c->backward) {
        Tensor yc = cuda_tensor(c->yc, io, 4, tok_shape);
        cuda_gspn_scan_fwd(&ctx, &xc, &gates, &merge, c->shared_w, &yc, hid);
        return CGSPN_OK;
    }
    Tensor dyc = cuda_tensor(c->dyc, io, 4, tok_shape);
    Tensor dxc = cuda_tensor(c->dxc, io, 4, tok_shape);
    Tensor dgates = cuda_tensor(c->dgates, io, 4, gate_shape);
    Tensor dmerge = cuda_tensor(c->dmerge, DTYPE_F32, 1, merge_shape);
    if (c->grad_mode == CGSPN_GRAD_OVERWRITE) {
        Tensor *zero[3] = {c->dxc ? &dxc : NULL, c->dgates ? &dgates : NULL,
                           c->dmerge ? &dmerge : NULL};
        for (int i = 0; i < 3; i++) {
            if (!zero[i]) continue;
            cudaError_t err = cudaMemsetAsync(zero[i]->data, 0, tensor_bytes(zero[i]), cc.stream);
            if (err != cudaSuccess)
                return fail(CGSPN_ERR_CUDA, "cgspn_gspn_scan_bwd: cudaMemsetAsync of a gradient "
                            "failed: %s", cudaGetErrorString(err));
        }
    }
    cuda_gspn_scan_bwd(&ctx, &dyc, &xc, &gates, &merge, c->shared_w, hid, 0,
                       c->dxc ? &dxc : NULL, c->dgates ? &dgates : NULL,
                       c->dmerge ? &dmerge : NULL);
    return CGSPN_OK;
}

static int cuda_run(const Call *c) {
    const char *fn = c->backward ? "cgspn_gspn_scan_bwd" : "cgspn_gspn_scan_fwd";
    if (!cuda_kernels_linked())
        return fail(CGSPN_ERR_UNSUPPORTED, "%s: this libcgspn has no CUDA scan kernel "
                    "(kernels/cuda/gspn_scan*.cu was not built in); use CGSPN_DEVICE_CPU", fn);

    const char *names[9] = {"xc", "gates", "merge", "hidden", "yc", "dyc", "dxc", "dgates",
                            "dmerge"};
    const void *ptrs[9] = {c->xc, c->gates, c->merge, c->hidden, c->yc, c->dyc, c->dxc,
                           c->dgates, c->dmerge};
    int device, previous;
    int status = cuda_enter(fn, 9, names, ptrs, &device, &previous);
    if (status != CGSPN_OK) return status;
    PoolCtx *pool = NULL;
    status = pool_take(device, &pool);
    if (status == CGSPN_OK) {
        CudaLaunch launch = {c, pool};
        status = trapped(cuda_launch, &launch);
        pool_give(pool);
    }
    cudaSetDevice(previous);
    return status;
}
#endif

#ifndef CGSPN_CUDA
// A CUDA call in a build without the CUDA kernels.
static int no_cuda_build(const char *fn) {
    return fail(CGSPN_ERR_UNSUPPORTED, "%s: this libcgspn was built without CUDA (no nvcc at "
                "build time); use CGSPN_DEVICE_CPU", fn);
}
#endif

CGSPN_API int cgspn_cuda_available(void) {
#ifdef CGSPN_CUDA
    return cuda_kernels_linked() && cuda_device_count() > 0;
#else
    return 0;
#endif
}

static int run(Call *c, int B, int H, int W, int Cc) {
    last_error[0] = '\0';
    int status = call_check(c, B, H, W, Cc);
    if (status != CGSPN_OK) return status;
    if (c->backward && !c->dxc && !c->dgates && !c->dmerge) return CGSPN_OK;
    if (c->device == CGSPN_DEVICE_CPU) return c->backward ? cpu_backward(c) : cpu_forward(c);
#ifdef CGSPN_CUDA
    return cuda_run(c);
#else
    return no_cuda_build(c->backward ? "cgspn_gspn_scan_bwd" : "cgspn_gspn_scan_fwd");
#endif
}

CGSPN_API int cgspn_gspn_scan_fwd(int device, void *stream, int dtype,
                                  int B, int H, int W, int Cc, int shared_w,
                                  const void *xc, const void *gates, const void *merge,
                                  void *yc, void *hidden) {
    Call c = {.device = device, .dtype = dtype, .shared_w = shared_w, .stream = stream,
              .xc = xc, .gates = gates, .merge = merge, .yc = yc, .hidden = hidden};
    return run(&c, B, H, W, Cc);
}

CGSPN_API int cgspn_gspn_scan_bwd(int device, void *stream, int dtype,
                                  int B, int H, int W, int Cc, int shared_w,
                                  const void *dyc, const void *xc, const void *gates,
                                  const void *merge, const void *hidden, int grad_mode,
                                  void *dxc, void *dgates, void *dmerge) {
    Call c = {.device = device, .dtype = dtype, .shared_w = shared_w, .grad_mode = grad_mode,
              .backward = 1, .stream = stream, .dyc = dyc, .xc = xc, .gates = gates,
              .merge = merge, .hidden = (void *)hidden, .dxc = dxc, .dgates = dgates,
              .dmerge = dmerge};
    return run(&c, B, H, W, Cc);
}

// ---- GSPN-1's gate recurrence ----------------------------------------------------------------
// Checked as the scan's calls are; the CPU runs kernels/cpu/gate_recurrent.h's cores (bf16
// through fp32 copies), CUDA the launchers of kernels/cuda/gate_recurrent.h (fp32 and bf16, planes
// of at most GR_CUDA_MAX_ROWS rows) on the caller's stream, on the GPU that holds the buffers.

typedef struct GrCall {
    int device, dtype, grad_mode, backward, chunk;
    int H, W;
    void *stream;
    size_t planes, n;   // N*C, N*C*H*W
    const void *dout, *x, *b, *g[3], *out_in;
    void *out, *dx, *db, *dg[3];
} GrCall;

static int gr_check(GrCall *c, int N, int C) {
    const char *fn = c->backward ? "cgspn_gate_recurrent_bwd" : "cgspn_gate_recurrent_fwd";
    const int status = check_common(fn, c->device, c->dtype, c->backward, c->grad_mode);
    if (status != CGSPN_OK) return status;
    if (N < 1 || C < 1 || c->H < 1 || c->W < 1)
        return fail(CGSPN_ERR_BAD_SHAPE, "%s: (N, C, H, W) = (%d, %d, %d, %d); each must be >= 1",
                    fn, N, C, c->H, c->W);
    if (c->chunk < 1)
        return fail(CGSPN_ERR_BAD_ARGUMENT, "%s: items_each_chunk = %d, expected >= 1", fn, c->chunk);
    size_t bytes;
    if (__builtin_mul_overflow((size_t)N, (size_t)C, &c->planes) ||
        __builtin_mul_overflow(c->planes, (size_t)c->H * (size_t)c->W, &c->n) ||
        __builtin_mul_overflow(c->n, (size_t)8, &bytes) || bytes > PTRDIFF_MAX)
        return fail(CGSPN_ERR_BAD_SHAPE, "%s: (N, C, H, W) = (%d, %d, %d, %d) is too large to "
                    "address", fn, N, C, c->H, c->W);
    const int any_grad = c->dx || c->db || c->dg[0] || c->dg[1] || c->dg[2];
    const char *missing = !c->x ? "x" : !c->b ? "b" : !c->g[0] ? "g1" : !c->g[1] ? "g2"
                        : !c->g[2] ? "g3" : !c->backward && !c->out ? "out"
                        : c->backward && any_grad && !c->dout ? "dout"
                        : c->backward && any_grad && !c->out_in ? "out" : NULL;
    if (missing) return fail(CGSPN_ERR_NULL_POINTER, "%s: %s is NULL", fn, missing);
    if (c->device == CGSPN_DEVICE_CUDA && c->dtype == CGSPN_DTYPE_F64)
        return fail(CGSPN_ERR_UNSUPPORTED, "%s: fp64 runs on the CPU only (use it as a reference); "
                    "CUDA takes CGSPN_DTYPE_F32 or _BF16", fn);
    return CGSPN_OK;
}

static int gr_cpu(const GrCall *c) {
    const char *fn = c->backward ? "cgspn_gate_recurrent_bwd" : "cgspn_gate_recurrent_fwd";
    const int bf16 = c->dtype == CGSPN_DTYPE_BF16, f64 = c->dtype == CGSPN_DTYPE_F64;
    const int overwrite = !c->backward || c->grad_mode == CGSPN_GRAD_OVERWRITE;
    const size_t n = c->n, esz = f64 ? 8 : bf16 ? 2 : 4;
    Scratch s = {0};
    const void *x = c->x, *b = c->b, *g[3] = {c->g[0], c->g[1], c->g[2]};
    const void *dout = c->dout, *out_in = c->out_in;
    void *out = c->out, *grad[5] = {c->dx, c->db, c->dg[0], c->dg[1], c->dg[2]};
    if (bf16) {   // fp32 copies in, fp32 results (the gradients zeroed) narrowed out
        x = scratch_widen(&s, c->x, n);
        b = scratch_widen(&s, c->b, n);
        for (int k = 0; k < 3; k++) g[k] = scratch_widen(&s, c->g[k], n);
        if (c->backward) {
            dout = scratch_widen(&s, c->dout, n);
            out_in = scratch_widen(&s, c->out_in, n);
            for (int k = 0; k < 5; k++)
                if (grad[k]) grad[k] = scratch_alloc(&s, n * sizeof(float), 1);
        } else {
            out = scratch_alloc(&s, n * sizeof(float), 0);
        }
    }
    void *dh = c->backward ? scratch_alloc(&s, n * (f64 ? 8 : 4), 0) : NULL;
    if (s.failed) return scratch_oom(&s, fn);

    void *const user_grad[5] = {c->dx, c->db, c->dg[0], c->dg[1], c->dg[2]};
    if (c->backward && overwrite && !bf16)
        for (int k = 0; k < 5; k++)
            if (user_grad[k]) memset(user_grad[k], 0, n * esz);
    if (f64) {
        if (!c->backward)
            gate_recurrent_fwd_f64(c->planes, c->H, c->W, c->chunk, x, b, g[0], g[1], g[2], out);
        else
            gate_recurrent_bwd_f64(c->planes, c->H, c->W, c->chunk, x, b, g[0], g[1], g[2], out_in,
                                   dout, dh, grad[0], grad[1], grad[2], grad[3], grad[4]);
    } else {
        if (!c->backward)
            gate_recurrent_fwd_f32(c->planes, c->H, c->W, c->chunk, x, b, g[0], g[1], g[2], out);
        else
            gate_recurrent_bwd_f32(c->planes, c->H, c->W, c->chunk, x, b, g[0], g[1], g[2], out_in,
                                   dout, dh, grad[0], grad[1], grad[2], grad[3], grad[4]);
    }
    if (bf16 && !c->backward) narrow_store(c->out, out, n, 0);
    if (bf16 && c->backward)
        for (int k = 0; k < 5; k++)
            if (user_grad[k]) narrow_store(user_grad[k], grad[k], n, !overwrite);
    scratch_free(&s);
    return CGSPN_OK;
}

#ifdef CGSPN_CUDA
static int gr_cuda(const GrCall *c) {
    const char *fn = c->backward ? "cgspn_gate_recurrent_bwd" : "cgspn_gate_recurrent_fwd";
    if (!cuda_gate_recurrent_fwd || !cuda_gate_recurrent_bwd)
        return fail(CGSPN_ERR_UNSUPPORTED, "%s: this libcgspn has no CUDA gate recurrence kernel "
                    "(kernels/cuda/gate_recurrent.cu was not built in); use CGSPN_DEVICE_CPU", fn);
    if (c->H > GR_CUDA_MAX_ROWS)
        return fail(CGSPN_ERR_UNSUPPORTED, "%s: H = %d rows; the CUDA kernel takes at most %d (a "
                    "block per plane, its threads holding the rows); use CGSPN_DEVICE_CPU", fn, c->H,
                    GR_CUDA_MAX_ROWS);
    const char *names[12] = {"x", "b", "g1", "g2", "g3", "out", "dout", "dx", "db", "dg1", "dg2",
                             "dg3"};
    const void *ptrs[12] = {c->x, c->b, c->g[0], c->g[1], c->g[2],
                            c->backward ? c->out_in : c->out, c->dout, c->dx, c->db, c->dg[0],
                            c->dg[1], c->dg[2]};
    int device, previous;
    const int status = cuda_enter(fn, 12, names, ptrs, &device, &previous);
    if (status != CGSPN_OK) return status;
    const DType io = c->dtype == CGSPN_DTYPE_BF16 ? DTYPE_BF16 : DTYPE_F32;
    const cudaStream_t stream = (cudaStream_t)c->stream;
    const cudaError_t err =
        c->backward
            ? cuda_gate_recurrent_bwd(io, c->planes, c->H, c->W, c->chunk, c->dout, c->x, c->b,
                                      c->g[0], c->g[1], c->g[2], c->out_in,
                                      c->grad_mode == CGSPN_GRAD_ACCUMULATE, c->dx, c->db,
                                      c->dg[0], c->dg[1], c->dg[2], stream)
            : cuda_gate_recurrent_fwd(io, c->planes, c->H, c->W, c->chunk, c->x, c->b, c->g[0],
                                      c->g[1], c->g[2], c->out, stream);
    cudaSetDevice(previous);
    if (err != cudaSuccess)
        return fail(CGSPN_ERR_BACKEND, "%s: the kernel's launch on GPU %d failed: %s", fn, device,
                    cudaGetErrorString(err));
    return CGSPN_OK;
}
#endif

static int gr_run(GrCall *c, int N, int C) {
    last_error[0] = '\0';
    const int status = gr_check(c, N, C);
    if (status != CGSPN_OK) return status;
    if (c->backward && !c->dx && !c->db && !c->dg[0] && !c->dg[1] && !c->dg[2]) return CGSPN_OK;
    if (c->device == CGSPN_DEVICE_CPU) return gr_cpu(c);
#ifdef CGSPN_CUDA
    return gr_cuda(c);
#else
    return no_cuda_build(c->backward ? "cgspn_gate_recurrent_bwd" : "cgspn_gate_recurrent_fwd");
#endif
}

CGSPN_API int cgspn_gate_recurrent_fwd(int device, void *stream, int dtype,
                                       int N, int C, int H, int W, int items_each_chunk,
                                       const void *x, const void *b, const void *g1,
                                       const void *g2, const void *g3, void *out) {
    GrCall c = {.device = device, .dtype = dtype, .chunk = items_each_chunk, .H = H, .W = W,
                .stream = stream, .x = x, .b = b, .g = {g1, g2, g3}, .out = out};
    return gr_run(&c, N, C);
}

CGSPN_API int cgspn_gate_recurrent_bwd(int device, void *stream, int dtype,
                                       int N, int C, int H, int W, int items_each_chunk,
                                       const void *dout, const void *x, const void *b,
                                       const void *g1, const void *g2, const void *g3,
                                       const void *out, int grad_mode,
                                       void *dx, void *db, void *dg1, void *dg2, void *dg3) {
    GrCall c = {.device = device, .dtype = dtype, .grad_mode = grad_mode, .backward = 1,
                .chunk = items_each_chunk, .H = H, .W = W, .stream = stream, .dout = dout,
                .x = x, .b = b, .g = {g1, g2, g3}, .out_in = out, .dx = dx, .db = db,
                .dg = {dg1, dg2, dg3}};
    return gr_run(&c, N, C);
}
