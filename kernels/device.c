// The device interface (kernels/device.h): the CPU's memory and clock here, the GPU's through
// kernels/cuda/ when this build has it. The one host file besides kernels/dispatch.c that
// tests CGSPN_CUDA.
#include "device.h"
#include "alloc_count.h"
#include "error.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#ifdef CGSPN_CUDA
#include "cuda/cuda_common.h"
#endif

bool device_has_cuda(void) {
#ifdef CGSPN_CUDA
    return true;
#else
    return false;
#endif
}

int device_gpu_count(void) {
#ifdef CGSPN_CUDA
    return cuda_device_count();
#else
    return 0;
#endif
}

Ctx device_open_gpu(int gpu, DType act_dtype) {
#ifdef CGSPN_CUDA
    return cuda_ctx_create(gpu, act_dtype);
#else
    (void)act_dtype;
    CG_FAIL("rebuild on a machine with nvcc on PATH (make clean && make), or set device = cpu",
            "GPU %d asked for, but this build has no CUDA backend", gpu);
#endif
}

void device_close(Ctx *ctx) {
#ifdef CGSPN_CUDA
    if (ctx->device == DEVICE_CUDA) cuda_ctx_destroy(ctx);
#endif
    (void)ctx;
}

DeviceInfo device_gpu_info(int gpu) {
    DeviceInfo d = {.index = gpu};
    CG_CHECK(gpu >= 0 && gpu < device_gpu_count(), "check nvidia-smi and CUDA_VISIBLE_DEVICES",
             "GPU %d asked for, %d visible", gpu, device_gpu_count());
#ifdef CGSPN_CUDA
    cuda_device_props(gpu, d.name, sizeof d.name, &d.sm_count, &d.total_bytes);
#endif
    return d;
}

DeviceInfo device_info(const Ctx *ctx) {
#ifdef CGSPN_CUDA
    if (ctx->device == DEVICE_CUDA) return device_gpu_info(((CudaCtx *)ctx->cuda)->device);
#endif
    (void)ctx;
    return (DeviceInfo){.name = "cpu", .index = -1};
}

void device_describe(const Ctx *ctx, FILE *f) {
    const char *prec = dtype_name(ctx->act_dtype);
    if (ctx->device == DEVICE_CPU) {
        fprintf(f, "device: cpu (%d threads, %s)\n", omp_get_max_threads(), prec);
        return;
    }
    DeviceInfo d = device_info(ctx);
    fprintf(f, "device: cuda:%d %s, %d SMs, %.1f GiB (%s)\n", d.index, d.name, d.sm_count,
            d.total_bytes / 1073741824.0, prec);
}

void *device_alloc(Ctx *ctx, size_t bytes) {
#ifdef CGSPN_CUDA
    if (ctx->device == DEVICE_CUDA) return cuda_malloc(bytes);
#endif
    void *p = NULL;
    size_t rounded = (bytes + 63) / 64 * 64;
    if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0)
        CG_FAIL("reduce batch_size or model size", "out of host memory allocating %zu bytes", bytes);
    alloc_count_add(DEVICE_CPU, p, rounded ? rounded : 64);
    return p;
}

void device_free(Ctx *ctx, void *p) {
#ifdef CGSPN_CUDA
    if (ctx->device == DEVICE_CUDA) { cuda_free(p); return; }
#endif
    alloc_count_remove(DEVICE_CPU, p);
    free(p);
}

DeviceMemoryUse device_memory_use(const Ctx *ctx) {
    DeviceMemoryUse u = {0};
    alloc_count_get(ctx->device, &u.now, &u.peak);
#ifdef CGSPN_CUDA
    if (ctx->device == DEVICE_CUDA) {
        size_t pool_now = 0, pool_peak = 0;
        cuda_pool_reserved(ctx, &pool_now, &pool_peak);
        u.now += pool_now;
        u.peak += pool_peak;
    }
#endif
    return u;
}

void device_memory_reset_peak(Ctx *ctx) {
    alloc_count_reset_peak(ctx->device);
#ifdef CGSPN_CUDA
    if (ctx->device == DEVICE_CUDA) cuda_pool_reset_peak(ctx);
#endif
}

void tensor_upload(Ctx *ctx, Tensor *t, const void *host) {
#ifdef CGSPN_CUDA
    if (t->device == DEVICE_CUDA) { cuda_upload(ctx, t->data, host, tensor_bytes(t)); return; }
#endif
    memcpy(t->data, host, tensor_bytes(t));
}

void tensor_download(Ctx *ctx, const Tensor *t, void *host) {
#ifdef CGSPN_CUDA
    if (t->device == DEVICE_CUDA) { cuda_download(ctx, host, t->data, tensor_bytes(t)); return; }
#endif
    memcpy(host, t->data, tensor_bytes(t));
}

void device_upload(Ctx *ctx, void *dst, const void *host, size_t bytes) {
#ifdef CGSPN_CUDA
    if (ctx->device == DEVICE_CUDA) { cuda_upload(ctx, dst, host, bytes); return; }
#endif
    memcpy(dst, host, bytes);
}

void tensor_upload_f32(Ctx *ctx, Tensor *t, const float *host) {
    if (t->dtype == DTYPE_F32) {
        tensor_upload(ctx, t, host);
        return;
    }
    uint16_t *tmp = cg_malloc(t->numel * sizeof(uint16_t));
    for (size_t i = 0; i < t->numel; i++) tmp[i] = f32_to_bf16(host[i]);
    tensor_upload(ctx, t, tmp);
    free(tmp);
}

float *tensor_to_host_f32(Ctx *ctx, const Tensor *t) {
    float *out = cg_malloc(t->numel * sizeof(float));
    if (t->dtype == DTYPE_F32) {
        tensor_download(ctx, t, out);
        return out;
    }
    uint16_t *raw = cg_malloc(t->numel * sizeof(uint16_t));
    tensor_download(ctx, t, raw);
    for (size_t i = 0; i < t->numel; i++) out[i] = bf16_to_f32(raw[i]);
    free(raw);
    return out;
}

void device_copy(Ctx *ctx, void *dst, const void *src, size_t bytes) {
#ifdef CGSPN_CUDA
    if (ctx->device == DEVICE_CUDA) { cuda_copy(ctx, dst, src, bytes); return; }
#endif
    memmove(dst, src, bytes);
}

void device_synchronize(Ctx *ctx) {
#ifdef CGSPN_CUDA
    if (ctx->device == DEVICE_CUDA) cuda_synchronize(ctx);
#endif
    (void)ctx;
}

void *device_pinned_alloc(size_t bytes) {
#ifdef CGSPN_CUDA
    void *p = cuda_pinned_alloc(bytes);
    if (p) return p;
#endif
    return cg_malloc(bytes);
}

void device_pinned_free(void *p) {
#ifdef CGSPN_CUDA
    if (cuda_pinned_free(p)) return;
#endif
    free(p);
}

struct DeviceEvent {
    Ctx *ctx;
    void *cuda;     // cudaEvent_t on the GPU
    double host_s;  // the wall clock at record time on the CPU
};

DeviceEvent *device_event_create(Ctx *ctx) {
    DeviceEvent *e = cg_calloc(1, sizeof *e);
    e->ctx = ctx;
#ifdef CGSPN_CUDA
    if (ctx->device == DEVICE_CUDA) e->cuda = cuda_event_create();
#endif
    return e;
}

void device_event_record(DeviceEvent *e) {
#ifdef CGSPN_CUDA
    if (e->cuda) { cuda_event_record(e->cuda, e->ctx); return; }
#endif
    e->host_s = omp_get_wtime();
}

void device_event_wait(DeviceEvent *e) {
#ifdef CGSPN_CUDA
    if (e->cuda) cuda_event_wait(e->cuda);
#endif
    (void)e;
}

double device_event_ms(const DeviceEvent *from, const DeviceEvent *to) {
#ifdef CGSPN_CUDA
    if (from->cuda) return cuda_event_ms(from->cuda, to->cuda);
#endif
    return (to->host_s - from->host_s) * 1e3;
}

void device_event_free(DeviceEvent *e) {
    if (!e) return;
#ifdef CGSPN_CUDA
    if (e->cuda) cuda_event_destroy(e->cuda);
#endif
    free(e);
}

struct DeviceGraph {
    Ctx *ctx;
    void *exec;             // cudaGraphExec_t
    unsigned long moves;    // the context's buffer moves at capture
};

void device_graph_begin(Ctx *ctx) {
    CG_CHECK(ctx->device == DEVICE_CUDA, "", "device_graph_begin: graphs need a GPU context");
#ifdef CGSPN_CUDA
    cuda_graph_begin(ctx);
#endif
}

DeviceGraph *device_graph_end(Ctx *ctx) {
    CG_CHECK(ctx->device == DEVICE_CUDA, "", "device_graph_end: graphs need a GPU context");
    DeviceGraph *g = cg_calloc(1, sizeof *g);
    g->ctx = ctx;
#ifdef CGSPN_CUDA
    g->exec = cuda_graph_end(ctx);
    g->moves = cuda_buffer_moves(ctx);
#endif
    return g;
}

bool device_graph_current(const DeviceGraph *g) {
#ifdef CGSPN_CUDA
    return cuda_buffer_moves(g->ctx) == g->moves;
#else
    (void)g;
    return false;
#endif
}

void device_graph_launch(DeviceGraph *g) {
#ifdef CGSPN_CUDA
    cuda_graph_launch(g->exec, g->ctx);
#endif
    (void)g;
}

void device_graph_free(DeviceGraph *g) {
    if (!g) return;
#ifdef CGSPN_CUDA
    if (g->exec) cuda_graph_destroy(g->exec);
#endif
    free(g);
}
