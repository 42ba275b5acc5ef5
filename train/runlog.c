#include "runlog.h"
#include "../kernels/error.h"
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void mkdir_p(const char *path) {
    char tmp[1024];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) CG_CHECK_ERRNO(0, tmp);
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) CG_CHECK_ERRNO(0, tmp);
}

void runlog_open(RunLog *r, const Config *c, const char *command) {
    memset(r, 0, sizeof(*r));
    char name[CONFIG_STR_MAX + 64];
    if (c->run_name[0]) {
        snprintf(name, sizeof(name), "%s", c->run_name);
    } else {
        time_t t = time(NULL);
        struct tm tm;
        localtime_r(&t, &tm);
        snprintf(name, sizeof(name), "%s_%04d%02d%02d_%02d%02d%02d", command, tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
    }
    int len = snprintf(r->dir, sizeof(r->dir), "%s/%s", c->out_dir, name);
    CG_CHECK(len > 0 && (size_t)len < sizeof(r->dir), "use a shorter out_dir", "run path too long");
    mkdir_p(r->dir);
    char path[sizeof(r->dir) + 32];
    snprintf(path, sizeof(path), "%s/config.cfg", r->dir);
    CG_CHECK_ERRNO(config_save(c, path) == 0, path);
    snprintf(path, sizeof(path), "%s/metrics.jsonl", r->dir);
    r->metrics = fopen(path, "a");
    CG_CHECK_ERRNO(r->metrics != NULL, path);
    r->t_start = now_seconds();
    r->tty = isatty(STDOUT_FILENO);
    printf("run folder: %s\n", r->dir);
}

void runlog_close(RunLog *r) {
    if (r->metrics) fclose(r->metrics);
    r->metrics = NULL;
}

void runlog_metrics(RunLog *r, long step, int n, const char *const *keys, const double *vals) {
    if (!r->metrics) return;
    fprintf(r->metrics, "{\"step\": %ld, \"time\": %.3f", step, now_seconds() - r->t_start);
    for (int i = 0; i < n; i++) fprintf(r->metrics, ", \"%s\": %.9g", keys[i], vals[i]);
    fprintf(r->metrics, "}\n");
    fflush(r->metrics);
}

const char *format_duration(double s, char *buf, size_t n) {
    if (!(s >= 0) || s > 1e8) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, n, "%lds", t);
    return buf;
}

void runlog_progress(RunLog *r, long step, long total, double seconds_per_step) {
    if (!r->tty || total <= 0) return;
    const int width = 30;
    int filled = (int)((double)step / total * width);
    char bar[64], eta[32];
    for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
    bar[width] = 0;
    format_duration((total - step) * seconds_per_step, eta, sizeof(eta));
    printf("\r[%s] %3d%% step %ld/%ld ETA %s   ", bar, (int)(100.0 * step / total), step, total, eta);
    fflush(stdout);
    if (step == total) printf("\n");
}
