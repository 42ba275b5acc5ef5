// Bytes of device memory this process holds, counted at each allocation and free, per kind of
// device: device_alloc on the CPU (kernels/device.c) and cuda_malloc on the GPU (parameters,
// arena chunks, the GPU libraries' workspaces). kernels/device.h's device_memory_use reads it.
// Thread-safe: a loader thread may allocate while the step runs.
#pragma once
#include "tensor.h"
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

void alloc_count_add(Device dev, const void *p, size_t bytes);
void alloc_count_remove(Device dev, const void *p);   // p not counted (NULL): nothing
// now: the bytes held; peak: most held at once since the last alloc_count_reset_peak.
void alloc_count_get(Device dev, size_t *now, size_t *peak);
void alloc_count_reset_peak(Device dev);

#ifdef __cplusplus
}
#endif
