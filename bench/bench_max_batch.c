// `cgspn bench distill --max-batch` (bench/bench_max_batch.h).
//
// An out-of-memory in cgspn is fatal (cg_fail exits), so every candidate batch runs in a child
// process of its own: fork, the child builds teacher and student, runs the warm-up and timed
// steps (bench_distill_alone: what `cgspn bench distill` times) and writes its ProbeResult to a
// pipe; its stdout and stderr go to a temporary file. Exit status 0 with a whole result and a
// finite loss: it fits. Otherwise the file says why: "out of memory" (CUDA's message for
// cudaErrorMemoryAllocation) or a library's ALLOC_FAILED is a batch that does not fit; anything
// else is a failure, printed under the table, that ends the search at that setting. The parent
// makes no CUDA call until every child has exited (a CUDA context does not survive fork).
#include "bench_max_batch.h"
#include "distill_step.h"
#include "timm_json.h"
#include "../kernels/device.h"
#include "../kernels/error.h"
#include "../train/runlog.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { MAX_SIZES = 8 };

// ---- the search --------------------------------------------------------------------------------

MaxBatch max_batch_search(int start, int cap, BatchProbe probe, void *arg) {
    MaxBatch m = {0};
    int b = start < cap ? start : cap;
    for (;;) {   // doubling
        ProbeResult r;
        m.probes++;
        const ProbeOutcome o = probe(arg, b, &r);
        if (o != PROBE_FITS) {
            m.no_fit = b;
            m.failed = o == PROBE_FAILED;
            if (m.failed) return m;
            break;
        }
        m.batch = b, m.at = r;
        if (b == cap) {
            m.capped = true;
            return m;
        }
        b = 2 * b < cap ? 2 * b : cap;
    }
    // bisection: m.batch fits, m.no_fit does not; to within an eighth of m.batch
    while (m.no_fit - m.batch > (m.batch / 8 > 1 ? m.batch / 8 : 1)) {
        int mid = m.batch + (m.no_fit - m.batch) / 2;
        ProbeResult r;
        m.probes++;
        const ProbeOutcome o = probe(arg, mid, &r);
        if (o == PROBE_FITS) m.batch = mid, m.at = r;
        else m.no_fit = mid;
        if (o == PROBE_FAILED) {
            m.failed = true;
            return m;
        }
    }
    return m;
}

// ---- one candidate in a child process ----------------------------------------------------------

typedef struct ProbeArgs {
    Config c;              // img_size and grad_checkpoint of this search; batch_size per probe
    int warmup, steps;
    char failure[512];     // the first failure that was not an out-of-memory ("" when none)
} ProbeArgs;

static void write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        CG_CHECK(k > 0, "", "bench distill --max-batch: writing the probe's result: %s", strerror(errno));
        p += k, n -= (size_t)k;
    }
}

static size_t read_all(int fd, void *buf, size_t n) {
    char *p = buf;
    size_t got = 0;
    char sink[256];
    for (;;) {   // to EOF; bytes past n are drained, so the child never blocks on a full pipe
        ssize_t k = got < n ? read(fd, p + got, n - got) : read(fd, sink, sizeof sink);
        if (k < 0 && errno == EINTR) continue;
        CG_CHECK(k >= 0, "", "bench distill --max-batch: reading the probe's result: %s", strerror(errno));
        if (k == 0) return got;
        if (got < n) got += (size_t)k;
    }
}

// The file's last non-empty line into line (the child's error message, usually).
static void last_line(const char *text, char *line, size_t n) {
    size_t len = strlen(text);
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == ' ')) len--;
    size_t start = len;
    while (start > 0 && text[start - 1] != '\n') start--;
    // a "  hint: ..." line follows cg_fail's message: take the message above it
    if (strncmp(text + start, "  hint:", 7) == 0 && start > 0) {
        len = start - 1;
        start = len;
        while (start > 0 && text[start - 1] != '\n') start--;
    }
    snprintf(line, n, "%.*s", (int)(len - start), text + start);
}

static char *read_file_text(const char *path) {
    FILE *f = fopen(path, "rb");
    CG_CHECK(f != NULL, "", "bench distill --max-batch: %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *s = cg_malloc(cap + 1);
    for (size_t k; (k = fread(s + n, 1, cap - n, f)) > 0;) {
        n += k;
        if (n == cap) s = cg_realloc(s, (cap *= 2) + 1);
    }
    CG_CHECK(!ferror(f), "", "bench distill --max-batch: reading %s failed", path);
    fclose(f);
    s[n] = 0;
    return s;
}

static _Noreturn void probe_child(const ProbeArgs *a, int batch, int result_fd, int log_fd) {
    CG_CHECK(dup2(log_fd, STDOUT_FILENO) >= 0 && dup2(log_fd, STDERR_FILENO) >= 0, "",
             "bench distill --max-batch: dup2: %s", strerror(errno));
    close(log_fd);
    Config c = a->c;
    c.batch_size = batch;
    DistillProbe p = bench_distill_alone(&c, a->warmup, a->steps);
    ProbeResult r = {p.img_per_s, p.gpu_gib, p.loss};
    write_all(result_fd, &r, sizeof r);
    close(result_fd);
    fflush(NULL);
    _exit(0);
}

static ProbeOutcome probe_in_child(void *arg, int batch, ProbeResult *r) {
    ProbeArgs *a = arg;
    int fd[2];
    CG_CHECK(pipe(fd) == 0, "", "bench distill --max-batch: pipe: %s", strerror(errno));
    const char *tmp = getenv("TMPDIR");
    char log[1024];
    snprintf(log, sizeof log, "%s/cgspn_max_batch_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    int log_fd = mkstemp(log);
    CG_CHECK(log_fd >= 0, "set TMPDIR to a writable folder", "bench distill --max-batch: "
             "mkstemp %s: %s", log, strerror(errno));
    fflush(NULL);   // nothing buffered may be written twice
    pid_t pid = fork();
    CG_CHECK(pid >= 0, "", "bench distill --max-batch: fork: %s", strerror(errno));
    if (pid == 0) {
        close(fd[0]);
        probe_child(a, batch, fd[1], log_fd);
    }
    close(fd[1]);
    close(log_fd);
    size_t got = read_all(fd[0], r, sizeof *r);
    close(fd[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        CG_CHECK(errno == EINTR, "", "bench distill --max-batch: waitpid: %s", strerror(errno));
    char *text = read_file_text(log);
    CG_CHECK(unlink(log) == 0, "", "bench distill --max-batch: removing %s: %s", log, strerror(errno));
    const bool exited0 = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    ProbeOutcome out;
    char why[400];
    if (exited0 && got == sizeof *r && isfinite(r->loss)) {
        out = PROBE_FITS;
        snprintf(why, sizeof why, "fits (%.1f img/s, %.2f GiB)", r->img_per_s, r->gpu_gib);
    } else if (strstr(text, "out of memory") || strstr(text, "ALLOC_FAILED")) {
        out = PROBE_OUT_OF_MEMORY;
        snprintf(why, sizeof why, "out of memory");
    } else {
        out = PROBE_FAILED;
        char line[300];
        last_line(text, line, sizeof line);
        if (exited0)
            snprintf(why, sizeof why, "failed: %s",
                     got == sizeof *r ? "the loss is not finite" : "no result");
        else if (WIFSIGNALED(status))
            snprintf(why, sizeof why, "failed: killed by signal %d; %s", WTERMSIG(status), line);
        else
            snprintf(why, sizeof why, "failed (exit %d): %s", WEXITSTATUS(status), line);
        if (!a->failure[0])
            snprintf(a->failure, sizeof a->failure, "batch %d %s", batch, why);
    }
    fprintf(stderr, "bench distill --max-batch: %d px, grad_checkpoint %d, batch %d: %s\n",
            a->c.img_size, a->c.grad_checkpoint, batch, why);
    free(text);
    return out;
}

// ---- the command -------------------------------------------------------------------------------

static int parse_sizes(const char *s, int *px, int max) {
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        CG_CHECK(end != p && v > 0 && v <= 100000 && (*end == ',' || *end == 0) && n < max,
                 "e.g. --sizes=378,1036", "--sizes=%s: expected up to %d image sides, comma-separated",
                 s, max);
        px[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    CG_CHECK(n > 0, "e.g. --sizes=378,1036", "--sizes is empty");
    return n;
}

typedef struct SizeRow {
    int px, ckpt;
    MaxBatch m;
    char failure[512];
} SizeRow;

static void print_device(const Config *c) {
    if (strcmp(c->device, "cpu") == 0 || device_gpu_count() == 0) {
        printf("device: cpu\n");
        return;
    }
    const DeviceInfo d = device_gpu_info(0);
    printf("device: %s (%d SMs, %.1f GiB)\n", d.name, d.sm_count, d.total_bytes / 1073741824.0);
}

static void print_rows(const SizeRow *rows, int n, const char *json) {
    printf("| px | grad_checkpoint | max batch | no fit at | img/s | GPU GiB (peak) | PyTorch | "
           "PyTorch max batch | PyTorch img/s | img/s ratio |\n"
           "|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        const SizeRow *r = &rows[i];
        const char *mode = r->ckpt ? "eager_ckpt" : "eager";
        int tb = (int)timm_json_numberf(json, "distill/%d/%s/max_batch", r->px, mode);
        int tcap = (int)timm_json_numberf(json, "distill/%d/%s/max_batch_capped", r->px, mode);
        double tips = timm_json_numberf(json, "distill/%d/%s/max_batch_img_per_s", r->px, mode);
        char nofit[32] = "-", tbs[16] = "-";
        if (r->m.no_fit > 0)
            snprintf(nofit, sizeof nofit, "%s%d", r->m.failed ? "failed at " : "", r->m.no_fit);
        if (tb > 0) snprintf(tbs, sizeof tbs, "%d%s", tb, tcap ? "+" : "");
        double ips = r->m.batch > 0 ? r->m.at.img_per_s : 0;
        printf("| %d | %d | %d%s | %s | %.1f | %.2f | %s | %s | %.1f | %.2fx |\n", r->px, r->ckpt,
               r->m.batch, r->m.capped ? "+" : "", nofit, ips, r->m.batch > 0 ? r->m.at.gpu_gib : 0,
               mode, tbs, tips, tips > 0 ? ips / tips : 0);
    }
    printf("(max batch: the largest that ran, + = it was the cap (more may fit); no fit at: the "
           "smallest that did not; img/s and GPU GiB at the max batch; PyTorch: the timm so14-shaped "
           "ViT -> ViT step at its own largest batch, eager, with set_grad_checkpointing(True) "
           "for grad_checkpoint 1; img/s ratio = cgspn / PyTorch; 0 = not measured)\n");
    for (int i = 0; i < n; i++)
        if (rows[i].px == 1036 && rows[i].ckpt == 1) {
            double tips = timm_json_number(json, "distill/1036/eager_ckpt/max_batch_img_per_s");
            double ratio = tips > 0 && rows[i].m.batch > 0 ? rows[i].m.at.img_per_s / tips : 0;
            printf("target, the PyTorch peer: the 1036 px grad_checkpoint 1 row against PyTorch's eager_ckpt "
                   "(so14 student Stage 2 at 1036 px, batch >= 32 with recomputation, >= 3x the "
                   "img/s of PyTorch ViT->ViT at 1036 px with gradient checkpointing at its own "
                   "largest batch): batch %d%s (>= 32: %s), img/s ratio %.2fx (>= 3x: %s)\n",
                   rows[i].m.batch, rows[i].m.capped ? "+" : "", rows[i].m.batch >= 32 ? "yes" : "no",
                   ratio, tips <= 0 ? "not measured" : ratio >= 3.0 ? "yes" : "no");
        }
}

int bench_distill_max_batch(const Config *c, const char *student_cfg, const char *sizes, int cap,
                            int warmup, int steps) {
    int px[MAX_SIZES];
    const int n_px = parse_sizes(sizes, px, MAX_SIZES);
    printf("distill --max-batch: the largest per-GPU batch of the Stage 2 step (student %s, "
           "teacher %s, random weights, taps %s, adaptors) at %s px, grad_checkpoint 0 and 1; "
           "each candidate in a process of its own, %d warm-up + %d timed steps; doubling from %d "
           "up to %d, then bisection to within an eighth\n", student_cfg, c->teacher_config,
           c->taps, sizes, warmup, steps, MAX_BATCH_START, cap);
    SizeRow rows[2 * MAX_SIZES];
    int n = 0, failed = 0;
    const double t0 = now_seconds();
    for (int i = 0; i < n_px; i++)
        for (int g = 0; g < 2; g++) {
            ProbeArgs a = {.c = *c, .warmup = warmup, .steps = steps};
            a.c.img_size = px[i];
            a.c.grad_checkpoint = g;
            SizeRow *r = &rows[n++];
            r->px = px[i], r->ckpt = g;
            r->m = max_batch_search(MAX_BATCH_START, cap, probe_in_child, &a);
            snprintf(r->failure, sizeof r->failure, "%s", a.failure);
            failed |= a.failure[0] != 0;
        }
    // Every child has exited: this process may use CUDA from here on.
    int probes = 0;
    for (int i = 0; i < n; i++) probes += rows[i].m.probes;
    print_device(c);
    printf("%d probes in %.0f s\n", probes, now_seconds() - t0);
    char *json = timm_json_load(stdout);
    print_rows(rows, n, json);
    for (int i = 0; i < n; i++)
        if (rows[i].failure[0])
            printf("%d px, grad_checkpoint %d: a probe failed without running out of memory (the "
                   "search stopped there): %s\n", rows[i].px, rows[i].ckpt, rows[i].failure);
    free(json);
    return failed ? 1 : 0;
}
