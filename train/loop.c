#include "loop.h"
#include "memory_report.h"
#include "../kernels/error.h"
#include <math.h>
#include <signal.h>

// ---- signals ---------------------------------------------------------------------------------

static volatile sig_atomic_t g_stop_signal;

// The first SIGINT/SIGTERM asks the loop to stop after the step; a second one ends the process
// at once (the default action), for a run stuck in a long step.
static void on_stop_signal(int sig) {
    if (g_stop_signal) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    g_stop_signal = sig;
}

typedef struct SignalGuard { struct sigaction old_int, old_term; } SignalGuard;

static void signals_install(SignalGuard *g) {
    g_stop_signal = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;   // the loader's reads go on; only the flag changes
    CG_CHECK_ERRNO(sigaction(SIGINT, &sa, &g->old_int) == 0, "sigaction(SIGINT)");
    CG_CHECK_ERRNO(sigaction(SIGTERM, &sa, &g->old_term) == 0, "sigaction(SIGTERM)");
}

static void signals_restore(const SignalGuard *g) {
    sigaction(SIGINT, &g->old_int, NULL);
    sigaction(SIGTERM, &g->old_term, NULL);
}

static const char *signal_name(void) {
    return g_stop_signal == SIGINT ? "SIGINT" : g_stop_signal == SIGTERM ? "SIGTERM"
                                                                         : "a signal to another rank";
}

// ---- the progress line -----------------------------------------------------------------------

static void log_line(const LoopSpec *s, const LoopHooks *h, long step, long epoch,
                     const StepStats *st, LoopWindow *w, double dt) {
    double mean = w->loss_n ? w->loss_sum / w->loss_n : NAN;
    size_t mem = memory_peak_take(s->ctx);   // measured, since the last line
    char mem_s[32], eta[32], perf[64] = "";
    bool mfu = s->flops_step > 0 && s->peak_flops > 0;
    if (mfu)
        snprintf(perf, sizeof perf, " | MFU %.1f%%", 100 * s->flops_step / dt / s->peak_flops);
    else if (s->flops_step > 0)
        snprintf(perf, sizeof perf, " | %.2f GFLOP/s", s->flops_step / dt / 1e9);
    if (s->log->tty) printf("\r\033[K");
    printf("step %6ld/%ld | epoch %ld | loss %.4f | lr %.2e | grad_norm %.3f | %.1f ms/step"
           " | %.0f img/s%s | mem %s | ETA %s\n",
           step + 1, s->total, epoch + 1, mean, st->lr, st->grad_norm, dt * 1e3,
           s->images_per_step / dt, perf, format_bytes(mem, mem_s, sizeof mem_s),
           format_duration((s->total - step - 1) * dt, eta, sizeof eta));
    const char *keys[7 + LOOP_EXTRA_METRICS] = {"loss", "lr", "grad_norm", "ms_per_step",
                                                "img_per_s", "mem_gib", "mfu"};
    double vals[7 + LOOP_EXTRA_METRICS] = {mean, st->lr, st->grad_norm, dt * 1e3,
                                           s->images_per_step / dt, mem / 1073741824.0,
                                           mfu ? s->flops_step / dt / s->peak_flops : 0};
    int n = mfu ? 7 : 6;
    if (h->log) h->log(h->self, w->loss_n, keys, vals, &n);
    runlog_metrics(s->log, step + 1, n, keys, vals);
    w->loss_sum = 0;
    w->loss_n = 0;
}

// ---- the loop --------------------------------------------------------------------------------

LoopResult loop_run(const LoopSpec *s, const LoopHooks *h, LoopWindow w) {
    const Config *c = s->c;
    bool skip_nonfinite = strcmp(c->on_nonfinite, "skip") == 0;
    LoopResult r = {TRAIN_DONE, s->first, w.skipped, 0};
    SignalGuard sg;
    signals_install(&sg);
    double t_prev = now_seconds(), t_ckpt = t_prev;
    int timed_n = 0;   // steps since t_prev
    long step = s->first;
    for (; step < s->total; step++) {
        float flags[LOOP_FLAGS] = {0};
        flags[LOOP_FLAG_STOP] = g_stop_signal ? 1.0f : 0.0f;
        flags[LOOP_FLAG_CKPT] = c->ckpt_minutes > 0 && now_seconds() - t_ckpt >= 60.0 * c->ckpt_minutes;
        LoopStepResult sr = h->step(h->self, step, flags);
        bool finite = isfinite(sr.loss);
        StepStats st = {.lr = lr_schedule(&s->opt->schedule, step), .grad_norm = NAN};
        if (finite) {
            st = dp_optimizer_step(s->dp, s->params, s->ctx, s->arena, s->opt, step);
            finite = st.finite;
        } else {
            dp_discard_step(s->dp, s->params, s->ctx);
        }
        if (s->step_losses) s->step_losses[step] = (float)sr.loss;
        if (!finite) {
            const char *what = isfinite(sr.loss) ? "the gradient norm" : "the loss";
            if (s->log->tty) printf("\r\033[K");
            if (!skip_nonfinite) {
                fprintf(stderr, "cgspn: %s is not finite at step %ld (loss %g, grad_norm %g); "
                        "stopping without a checkpoint of it (the newest checkpoint in %s is the "
                        "last good state)\n  hint: lower lr, enable grad_clip, or set on_nonfinite = "
                        "skip\n", what, step + 1, sr.loss, st.grad_norm, s->log->dir);
                r.status = TRAIN_NONFINITE;
                r.nonfinite_step = step + 1;
                break;
            }
            w.skipped++;
            printf("step %ld: %s is not finite; update skipped (%ld skipped so far)\n", step + 1,
                   what, w.skipped);
            const char *keys[] = {"nonfinite_skipped"};
            double vals[] = {(double)w.skipped};
            runlog_metrics(s->log, step + 1, 1, keys, vals);
        } else {
            if (h->updated) h->updated(h->self, step);
            w.loss_sum += sr.loss;
            w.loss_n++;
        }

        if (step == s->first) {   // the arena's placement is now the one of every step
            MemoryPlan plan = memory_plan(s->ctx, s->tables, s->n_tables, s->arena);
            if (s->log->tty) printf("\r\033[K");
            memory_plan_print(stdout, &plan);
        }
        bool last = step + 1 == s->total;
        bool stop = s->stop_after > 0 && step + 1 == s->stop_after && !last;
        bool interrupted = flags[LOOP_FLAG_STOP] > 0 && !last;
        timed_n++;
        if ((c->log_every > 0 && (step + 1) % c->log_every == 0) || last) {
            log_line(s, h, step, sr.epoch, &st, &w, (now_seconds() - t_prev) / timed_n);
            t_prev = now_seconds();
            timed_n = 0;
        } else {
            runlog_progress(s->log, step + 1, s->total, (now_seconds() - t_prev) / timed_n);
        }
        if (h->eval && ((step + 1) % s->eval_every == 0 || last)) {
            double t0 = now_seconds();
            h->eval(h->self, step + 1);
            t_prev += now_seconds() - t0;
        }
        if ((c->ckpt_every > 0 && (step + 1) % c->ckpt_every == 0) || flags[LOOP_FLAG_CKPT] > 0 ||
            last || stop || interrupted) {
            double t0 = now_seconds();
            h->save(h->self, step + 1, &w);
            t_prev += now_seconds() - t0;
            t_ckpt = now_seconds();
        }
        if (stop || interrupted) {
            step++;
            if (interrupted)
                printf("interrupted by %s after step %ld of %ld: checkpoint written; continue with "
                       "--resume=auto (run folder %s)\n", signal_name(), step, s->total,
                       s->log->dir);
            else
                printf("stopping after step %ld of %ld\n", step, s->total);
            r.status = interrupted ? TRAIN_INTERRUPTED : TRAIN_STOPPED;
            break;
        }
    }
    signals_restore(&sg);
    r.step = step;
    r.skipped = w.skipped;
    return r;
}
