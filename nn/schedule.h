// Learning-rate schedule: linear warmup, then cosine decay (docs/design.md#classification). Steps are 0-based
// optimizer steps; lr_schedule(s, step) is the rate used BY that step.
//
//   step <  warmup_steps:           lr = base_lr * (step + 1) / warmup_steps
//       (the first step already moves, at base_lr / warmup_steps; step warmup_steps-1 is base_lr)
//   warmup_steps <= step < total:   t = (step - warmup_steps) / (total_steps - warmup_steps)
//                                   lr = min_lr + (base_lr - min_lr) * (1 + cos(pi t)) / 2
//   step >= total_steps:            lr = min_lr
//
// The cosine part is timm's CosineLRScheduler(t_initial = total - warmup, lr_min = min_lr,
// cycle_limit = 1, warmup_prefix = True, t_in_epochs = False) stepped per update: it starts at
// base_lr right after warmup and reaches min_lr at step total_steps (so the last step run,
// total_steps - 1, is one cosine step above min_lr). It differs from timm's warmup only there:
// timm starts warmup at warmup_lr_init (step 0 at lr 0 would be a wasted step).
#pragma once

typedef struct LrSchedule {
    float base_lr, min_lr;
    long warmup_steps, total_steps;   // warmup may be 0; total counts the warmup too
} LrSchedule;

float lr_schedule(const LrSchedule *s, long step);
