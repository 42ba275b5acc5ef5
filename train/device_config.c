#include "device_config.h"
#include "../dist/dist.h"
#include "../kernels/error.h"

bool device_is_cpu(const Config *c) {
    if (strcmp(c->device, "cpu") == 0) return true;
    if (strcmp(c->device, "cuda") == 0) return false;
    return device_gpu_count() == 0;
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
    int gpus = device_gpu_count();
    if (want_cuda) {
        CG_CHECK(device_has_cuda(),
                 "rebuild on a machine with nvcc on PATH (make clean && make), or set device = cpu",
                 "device = cuda, but this build has no CUDA backend");
        CG_CHECK(gpus > 0, "check nvidia-smi, or set device = cpu",
                 "device = cuda, but no CUDA device is visible");
    }
    bool use_cuda = !want_cpu && gpus > 0;
    bool autocast = strcmp(c->precision, "auto") == 0;
    if (!use_cuda && !want_cpu)
        printf("note: no GPU found, running on the CPU%s\n",
               autocast ? " in fp32 (precision = auto: bf16 on a GPU, fp32 on the CPU)" : "");
    bool bf16 = strcmp(c->precision, "bf16") == 0 || (autocast && use_cuda);
    if (!use_cuda) {
        CG_CHECK(!bf16, "set precision = fp32 (or auto) on the CPU",
                 "precision = bf16 needs the GPU; the CPU backend is the fp32 reference");
        return ctx_cpu();
    }
    int gpu = dist->local_rank % gpus;   // one GPU per rank on each host
    return device_open_gpu(gpu, bf16 ? DTYPE_BF16 : DTYPE_F32);
}

// Dense peak rates (no sparsity) by the marketing name in cudaDeviceProp.name, first match
// wins (so "H100 PCIe" before "H100"): bf16 tensor cores, and fp32 (non-tensor) FMA.
static const struct { const char *name; double bf16_tflops, fp32_tflops; } kPeaks[] = {
    {"H200", 989.4, 66.9},      {"GH200", 989.4, 66.9},  {"H100 NVL", 835.0, 60.0},
    {"H100 PCIe", 756.0, 51.2}, {"H100", 989.4, 66.9},   {"H800", 989.4, 66.9},
    {"B200", 2250.0, 80.0},     {"A100", 312.0, 19.5},   {"A800", 312.0, 19.5},
    {"L40S", 362.1, 91.6},      {"L40", 181.0, 90.5},    {"L4", 121.0, 30.3},
    {"A10G", 70.0, 31.2},       {"A10", 125.0, 31.2},    {"RTX 4090", 165.2, 82.6},
    {"RTX 3090", 71.0, 35.6},   {"V100", 125.0, 15.7},   {"T4", 65.0, 8.1},
};

double device_peak_flops(const Ctx *ctx, const Config *c) {
    if (ctx->device != DEVICE_CUDA) return 0;
    if (c->peak_tflops > 0) return c->peak_tflops * 1e12;
    const DeviceInfo d = device_info(ctx);
    for (size_t i = 0; i < sizeof kPeaks / sizeof kPeaks[0]; i++)
        if (strstr(d.name, kPeaks[i].name))
            return (ctx->act_dtype == DTYPE_BF16 ? kPeaks[i].bf16_tflops : kPeaks[i].fp32_tflops) * 1e12;
    return 0;
}
