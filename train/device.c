#include "device.h"
#include "../dist/dist.h"
#include "../nn/error.h"
#include <omp.h>
#ifdef CGSPN_CUDA
#include "../kernels/cuda/cuda_common.h"
#endif

static int gpu_count(void) {
#ifdef CGSPN_CUDA
    return cuda_device_count();
#else
    return 0;
#endif
}

Ctx device_open(const Config *c) {
    // The process group: its timeout, and the rendezvous of ranks started without MPI.
    Dist *dist = dist_process();
    char err[1024];
    if (dist_setup_err(dist, &(DistOptions){c->dist_timeout_s, c->dist_rendezvous}, err,
                       sizeof err) != 0)
        CG_FAIL("", "%s", err);
    bool want_cuda = strcmp(c->device, "cuda") == 0;
    bool want_cpu = strcmp(c->device, "cpu") == 0;
    int gpus = gpu_count();
    if (want_cuda) {
#ifndef CGSPN_CUDA
        CG_FAIL("rebuild on a machine with nvcc on PATH (make clean && make), or set device = cpu",
                "device = cuda, but this build has no CUDA backend");
#endif
        CG_CHECK(gpus > 0, "check nvidia-smi, or set device = cpu",
                 "device = cuda, but no CUDA device is visible");
    }
    bool use_cuda = !want_cpu && gpus > 0;
    if (!use_cuda && !want_cpu) printf("note: no GPU found, running on the CPU\n");
    bool bf16 = strcmp(c->precision, "bf16") == 0 || (strcmp(c->precision, "auto") == 0 && use_cuda);
    if (!use_cuda) {
        CG_CHECK(!bf16, "set precision = fp32 (or auto) on the CPU",
                 "precision = bf16 needs the GPU; the CPU backend is the fp32 reference");
        return ctx_cpu();
    }
#ifdef CGSPN_CUDA
    int dev = dist->local_rank % gpus;   // one GPU per rank on each host
    return cuda_ctx_create(dev, bf16 ? DTYPE_BF16 : DTYPE_F32);
#else
    return ctx_cpu();
#endif
}

void device_close(Ctx *ctx) {
#ifdef CGSPN_CUDA
    if (ctx->device == DEVICE_CUDA) cuda_ctx_destroy(ctx);
#endif
    (void)ctx;
}

void device_describe(const Ctx *ctx, FILE *f) {
    const char *prec = dtype_name(ctx->act_dtype);
    if (ctx->device == DEVICE_CPU) {
        fprintf(f, "device: cpu (%d threads, %s)\n", omp_get_max_threads(), prec);
        return;
    }
#ifdef CGSPN_CUDA
    struct cudaDeviceProp p;
    CudaCtx *cc = (CudaCtx *)ctx->cuda;
    CUDA_CHECK(cudaGetDeviceProperties(&p, cc->device));
    fprintf(f, "device: cuda:%d %s, %d SMs, %.1f GiB (%s)\n", cc->device, p.name,
            p.multiProcessorCount, p.totalGlobalMem / 1073741824.0, prec);
#endif
}
