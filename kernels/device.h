// The one device interface: memory, copies, timing marks and facts about the GPU, for every
// layer above the kernels (nn/, dist/, train/, bench/). kernels/device.c is the one host file
// that knows which backends this build has, as kernels/dispatch.c is for the ops; nothing above
// kernels/ includes kernels/cuda/ or tests CGSPN_CUDA.
#pragma once
#include "ctx.h"
#include <stdbool.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

// Whether this build has the CUDA backend (nvcc was found when it was built).
bool device_has_cuda(void);
// GPUs visible to this process: 0 without the CUDA backend or without a driver.
int device_gpu_count(void);
// A context on GPU `gpu` (streams, cuBLASLt handle) with activations in act_dtype. Fails with a
// hint when the build has no CUDA backend.
Ctx device_open_gpu(int gpu, DType act_dtype);
// Frees what a context holds (nothing on the CPU).
void device_close(Ctx *ctx);

typedef struct DeviceInfo {
    char name[256];      // "NVIDIA H100 80GB HBM3", or "cpu"
    int index;           // the GPU's ordinal (-1 on the CPU)
    int sm_count;        // 0 on the CPU
    size_t total_bytes;  // the GPU's memory (0 on the CPU)
} DeviceInfo;
DeviceInfo device_info(const Ctx *ctx);
// GPU `gpu` without a context (fails when there is no such GPU).
DeviceInfo device_gpu_info(int gpu);
// "device: cpu (2 threads, fp32)" / "device: cuda:0 NVIDIA H100, 132 SMs, 79.1 GiB (bf16)"
void device_describe(const Ctx *ctx, FILE *f);
// Device memory this process holds on the context's kind of device: what device_alloc and the
// GPU libraries' workspaces hold (counted per allocation), plus on the GPU what the stream-ordered
// pool of per-op temporaries has reserved (it keeps it between steps, as PyTorch's caching
// allocator does, so `peak` compares with torch.cuda.max_memory_reserved). Not the CUDA context
// itself. now: at the call; peak: most at once since the last device_memory_reset_peak (an upper
// bound: the pool's high-water mark is added to the allocations' one).
typedef struct DeviceMemoryUse { size_t now, peak; } DeviceMemoryUse;
DeviceMemoryUse device_memory_use(const Ctx *ctx);
void device_memory_reset_peak(Ctx *ctx);

// Memory on the context's device (64-byte aligned on the CPU); checked, never NULL.
void *device_alloc(Ctx *ctx, size_t bytes);
void device_free(Ctx *ctx, void *p);
// Copies between host and the tensor's device; n = t->numel elements of t's dtype.
void tensor_upload(Ctx *ctx, Tensor *t, const void *host);
void tensor_download(Ctx *ctx, const Tensor *t, void *host);
// Uploads fp32 host values into a tensor of any dtype (rounding to bf16 when needed).
void tensor_upload_f32(Ctx *ctx, Tensor *t, const float *host);
// A host fp32 copy of any tensor (converts bf16); caller frees.
float *tensor_to_host_f32(Ctx *ctx, const Tensor *t);
// bytes from the host to dst on the context's device (done when it returns).
void device_upload(Ctx *ctx, void *dst, const void *host, size_t bytes);
// bytes from src to dst, both on the context's device, queued on its stream.
void device_copy(Ctx *ctx, void *dst, const void *src, size_t bytes);
// Waits until the context's queued work is done (returns at once on the CPU).
void device_synchronize(Ctx *ctx);

// Page-locked host memory for the loader's batch buffers when a GPU is present (faster
// uploads), plain malloc otherwise; free with device_pinned_free.
void *device_pinned_alloc(size_t bytes);
void device_pinned_free(void *p);

// Timing marks on the context's stream: CUDA events on the GPU, the wall clock on the CPU.
typedef struct DeviceEvent DeviceEvent;
DeviceEvent *device_event_create(Ctx *ctx);
void device_event_record(DeviceEvent *e);
void device_event_wait(DeviceEvent *e);   // the host waits until the mark is reached
double device_event_ms(const DeviceEvent *from, const DeviceEvent *to);
void device_event_free(DeviceEvent *e);

// A recorded sequence of the context's GPU work (a CUDA graph), replayed with one launch: the
// kernels' arguments, addresses included, are fixed at capture, so a replay reads and writes the
// buffers the captured pass did. Between begin and end the work is recorded, not run; nothing in
// it may wait on the host. GPU contexts only.
typedef struct DeviceGraph DeviceGraph;
void device_graph_begin(Ctx *ctx);
DeviceGraph *device_graph_end(Ctx *ctx);
void device_graph_launch(DeviceGraph *g);   // queued on the capturing context's stream
// Whether every buffer the capture used is still where it was: false once a growing buffer of
// the context (an op's scratch, attention's workspace) has moved, after which a replay would
// touch freed memory; capture again then.
bool device_graph_current(const DeviceGraph *g);
void device_graph_free(DeviceGraph *g);

#ifdef __cplusplus
}
#endif
