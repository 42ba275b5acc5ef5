// `cgspn curriculum`: the resolution curriculum with upsampling self-distillation (docs/design.md#curriculum,
// paper Sec. 5.3).
//
// resolutions = r0,r1,...,rK. Stage 0 is the given student (init: a Stage 2 output) at r0; it is
// not trained. Stage k = 1..K is a Stage 2 distillation run (train/distill.h) at img_size = r_k
// whose frozen teacher is stage k-1's final student seeing the same augmented image resized
// (antialiased) to r_{k-1}; the teacher's PP and PB taps are bilinearly upsampled (half-pixel
// centres) to the student's grid and supervise it through the dual-tap MSE + KL loss with fresh
// adaptors. The student starts as its teacher (copy_teacher: every tensor but the adaptors).
//
// Folders: out_dir/run_name/curriculum.cfg (the resolved config; its model keys are every
// stage's teacher's) and out_dir/run_name/stageK_RRRpx/ (a distillation run folder: checkpoints,
// config.cfg, metrics.jsonl). A stage whose newest complete checkpoint is at its last step is
// finished and is not run again; the first unfinished one resumes from its newest complete
// checkpoint (bit-exactly, as cgspn distill --resume=auto) or starts.
#pragma once
#include "classify.h"
#include "resolution.h"

int cmd_curriculum(int argc, char **argv);

typedef struct CurriculumPlan {
    int n_res;                       // K + 1 resolutions; stages 1..K train
    int res[RESOLUTION_MAX];         // r0..rK
    long steps[RESOLUTION_MAX];      // optimizer steps of stage k (index k >= 1)
    float lr[RESOLUTION_MAX];        // peak lr of stage k
} CurriculumPlan;

// resolutions, stage_steps | stage_samples, stage_lr of c checked and expanded (a single value
// applies to every stage). 0, or -1 with a message.
int curriculum_plan_err(const Config *c, CurriculumPlan *p, char *err, size_t n);
// The run folder (out_dir/run_name) and stage k's folder in it.
void curriculum_run_dir(const Config *c, char *out, size_t n);
void curriculum_stage_dir(const Config *c, const CurriculumPlan *p, int k, char *out, size_t n);
// The cgspn distill config of stage k >= 1 (see above).
void curriculum_stage_config(const Config *c, const CurriculumPlan *p, int k, Config *out);

typedef struct CurriculumOptions {
    int stop_stage;                  // with stop_after: stop stage stop_stage after that step
    long stop_after;                 // (a checkpoint is written, as an interrupted run would)
    float *step_losses[RESOLUTION_MAX];   // per stage k (index k), one float per step, or NULL
} CurriculumOptions;

typedef struct CurriculumResult {
    int stages_done;                 // finished stages (0..K)
    bool stopped;                    // a stage stopped early: stop_after, a signal, or a
                                     // non-finite loss (status says which)
    TrainStatus status;              // the stopped stage's (TRAIN_DONE when none stopped)
    EvalResult eval[RESOLUTION_MAX]; // the student head's test accuracy after stage k (count 0:
                                     // no head, or the stage was finished before this run)
    char final_dir[1200];            // the last stage's folder (its final student)
} CurriculumResult;

// Runs (or resumes) the curriculum of c. o may be NULL.
CurriculumResult curriculum_run(const Config *c, const CurriculumOptions *o);
