#include <math.h>
#include "schedule.h"
#include "../kernels/error.h"

float lr_schedule(const LrSchedule *s, long step) {
    CG_CHECK(step >= 0 && s->warmup_steps >= 0, "", "lr schedule: step %ld, warmup %ld", step,
             s->warmup_steps);
    if (step < s->warmup_steps)
        return (float)((double)s->base_lr * (double)(step + 1) / (double)s->warmup_steps);
    if (step >= s->total_steps) return s->min_lr;
    double t = (double)(step - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
    return (float)(s->min_lr + ((double)s->base_lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * t)));
}
