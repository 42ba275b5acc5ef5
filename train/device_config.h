// The backend a command runs on, from the config keys `device` and `precision` (the device
// itself, its memory and timing: kernels/device.h).
#pragma once
#include "config.h"
#include "../kernels/device.h"

// device = auto picks the GPU when this build has CUDA and one is visible, else the CPU with
// a one-line notice; precision = auto is bf16 on the GPU and fp32 on the CPU.
// In a multi-process run (dist_process(), dist/dist.h) it first completes the process group's
// setup (dist_timeout_s, dist_rendezvous), and each rank takes GPU local_rank % visible GPUs.
Ctx device_open(const Config *c);
// Whether device_open would pick the CPU: device = cpu, or auto without a visible GPU (or
// without a CUDA build). Opens nothing.
bool device_is_cpu(const Config *c);
// Peak FLOP/s for the MFU column: the config's peak_tflops when set, else a table by GPU name for
// the run's precision (bf16 tensor cores or fp32); 0 on the CPU or for an unknown GPU.
double device_peak_flops(const Ctx *ctx, const Config *c);
