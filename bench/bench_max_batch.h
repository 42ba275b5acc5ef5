// `cgspn bench distill --max-batch` (bench/bench_max_batch.c): the largest per-GPU batch of the
// Stage 2 step that fits the GPU, at each image side, with grad_checkpoint 0 and 1, and its img/s,
// beside PyTorch's (bench/bench_timm.py: distill/<px>/<eager|eager_ckpt>/max_batch).
#pragma once
#include "../train/config.h"
#include <stdbool.h>

#define MAX_BATCH_SIZES "378,1036"   // the so14 student's Stage 2 side and the curriculum's
enum {
    MAX_BATCH_START = 8,     // the first candidate; doubled until one does not fit
    MAX_BATCH_CAP = 1024,    // the largest tried ("capped" when it fits)
    MAX_BATCH_WARMUP = 1,    // steps per candidate: a 1036 px step takes seconds
    MAX_BATCH_STEPS = 2,
};

typedef struct ProbeResult {
    double img_per_s, gpu_gib;
    float loss;
} ProbeResult;

typedef enum { PROBE_FITS, PROBE_OUT_OF_MEMORY, PROBE_FAILED } ProbeOutcome;

// Runs the step at `batch`; fills r when it fits.
typedef ProbeOutcome (*BatchProbe)(void *arg, int batch, ProbeResult *r);

typedef struct MaxBatch {
    int batch;        // the largest batch that fitted (0: none did)
    int no_fit;       // the smallest that did not (0: none failed: capped)
    bool capped;      // the cap fitted: a larger batch may too
    bool failed;      // a probe failed without running out of memory: the search stopped there
    int probes;
    ProbeResult at;   // measured at `batch`
} MaxBatch;

// Doubling from min(start, cap) until a candidate does not fit (or the cap fits), then bisection
// between the largest that fitted and the smallest that did not, until they are within an eighth
// of the former (or adjacent). A failed probe (PROBE_FAILED) ends the search (failed = true;
// no_fit = that batch): the error is not the GPU's memory, and would recur.
MaxBatch max_batch_search(int start, int cap, BatchProbe probe, void *arg);

// The whole command: c is the run config (student, teacher, taps...); sizes "378,1036".
// Forks a child per candidate batch, so it must run before this process makes any CUDA call.
int bench_distill_max_batch(const Config *c, const char *student_cfg, const char *sizes, int cap,
                            int warmup, int steps);
