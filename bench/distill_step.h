// One timed Stage 2 distillation measurement (bench/distill_step.c): what `cgspn bench distill`
// (bench/bench_dist.c) runs per phase and each --max-batch probe (bench/bench_max_batch.c) runs
// in its child process. bench/bench_dist.c's opening comment says what a timed step is.
#pragma once
#include "op_profile.h"
#include "../train/config.h"
#include "../dist/grads.h"
#include "../dist/dist.h"
#include <stdbool.h>
#include <stddef.h>

// A step of the so14 pair takes on the order of a second; the 1-GPU phase runs on every rank at
// once, but a slow model build on one rank must not trip the collectives' deadline.
#define BENCH_DIST_TIMEOUT_S 600.0

enum { BENCH_PROFILE_OPS = 160 };

// One extra step after the timed ones with an event pair around every op (--profile; rank 0's).
typedef struct BenchProfile {
    bool done;
    double step_ms;
    OpPhase phases[OP_PROFILE_MAX_PHASES];
    int n_phases;
    OpTotal ops[BENCH_PROFILE_OPS];
    int n_ops;
    DistCommProfile comm;
    bool has_comm;
} BenchProfile;

typedef struct BenchResult {
    double seconds;          // the timed steps, the slowest rank's
    double img_per_s;        // global
    float loss;              // of the last step (a finite number shows the step did real work)
    int world, global_batch, grad_checkpoint;
    size_t gpu_peak;         // this rank's device_memory_use peak since its context opened
    BenchProfile prof;
} BenchResult;

// warmup + steps distillation steps of config c (batch_size = per-rank batch) across group d.
// say: SAY_DEVICE prints the device first (rank 0's first call), SAY_PLAN the memory plan after
// the steps (rank 0's).
// profile: one more step, timed op by op (BenchProfile).
enum { SAY_DEVICE = 1, SAY_PLAN = 2 };
BenchResult bench_steps(const Config *c, Dist *d, int warmup, int steps, bool overlap, int say,
                        bool profile);

// One Stage 2 measurement of config c (batch_size per GPU) in a world of one: what each
// --max-batch probe runs in its child process.
typedef struct DistillProbe {
    double img_per_s;   // over the timed steps
    double gpu_gib;     // device_memory_use peak since the context opened
    float loss;         // of the last timed step
} DistillProbe;
DistillProbe bench_distill_alone(const Config *c, int warmup, int steps);
