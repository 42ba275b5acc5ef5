// The backend a command runs on, from the config keys `device` and `precision`.
#pragma once
#include "config.h"
#include "../kernels/ctx.h"

// device = auto picks the GPU when this build has CUDA and one is visible, else the CPU with
// a one-line notice; precision = auto is bf16 on the GPU and fp32 on the CPU.
// In a multi-process run (dist_process(), dist/dist.h) it first completes the process group's
// setup (dist_timeout_s, dist_rendezvous), and each rank takes GPU local_rank % visible GPUs.
Ctx device_open(const Config *c);
void device_close(Ctx *ctx);
// "cpu (2 threads, fp32)" / "cuda:0 NVIDIA H100 (bf16)"
void device_describe(const Ctx *ctx, FILE *f);
