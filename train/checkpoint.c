#include "checkpoint.h"
#include "../kernels/ops.h"
#include "../kernels/error.h"
#include "../nn/params_io.h"
#include "../nn/safetensors.h"
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

#define STATE_FORMAT  "cgspn-train-state"
#define STATE_VERSION "1"
#define LIST_SHOWN 8

// Model keys whose values are shown when a resume is refused for changed shapes.
static const char *const kModelKeys[] = {
    "model", "img_size", "in_chans", "patch", "width", "depth", "heads", "mlp_hidden",
    "class_token", "reg_tokens", "pos_embed", "no_embed_class", "norm_pre", "fc_norm",
    "layer_scale_init", "num_classes", "qkv_bias", "gspn_latent",
    "gspn_shared_w", "gspn_out_norm", "attn_every",
};

__attribute__((format(printf, 3, 4)))
static void append(char *err, size_t n, const char *fmt, ...) {
    size_t len = strlen(err);
    if (len + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + len, n - len, fmt, ap);
    va_end(ap);
}

// ---- folders ----------------------------------------------------------------------------------

void ckpt_dir_name(const char *run_dir, long step, char *out, size_t n) {
    snprintf(out, n, "%s/step_%08ld", run_dir, step);
}

void ckpt_tmp_dir_name(const char *run_dir, long step, char *out, size_t n) {
    snprintf(out, n, "%s/step_%08ld.tmp", run_dir, step);
}

// "step_00001200" -> 1200; -1 for any other name (suffixes included).
static long parse_step_name(const char *name) {
    if (strncmp(name, "step_", 5) != 0 || !name[5]) return -1;
    long v = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || v > (LONG_MAX - 9) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

static bool is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static bool is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int mkdir_p_err(const char *path, char *err, size_t n) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) return cg_set_error(err, n, "%s: path too long", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return cg_set_error(err, n, "%s: %s", tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return cg_set_error(err, n, "%s: %s", tmp, strerror(errno));
    return 0;
}

// rm -rf path (files and folders; links are removed, not followed). 0, or -1 with errno.
static int remove_tree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(sb.st_mode)) return unlink(path);
    DIR *d = opendir(path);
    if (!d) return -1;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char child[PATH_MAX];
        if (snprintf(child, sizeof child, "%s/%s", path, e->d_name) >= (int)sizeof child) {
            errno = ENAMETOOLONG;
            rc = -1;
            continue;
        }
        if (remove_tree(child) != 0) rc = -1;
    }
    closedir(d);
    if (rc == 0) rc = rmdir(path);
    return rc;
}

static int fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

static int cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? -1 : x > y;
}

// Steps of the complete checkpoints, ascending (malloc'd into *out); count.
static int list_complete(const char *run_dir, long **out) {
    *out = NULL;
    DIR *d = opendir(run_dir);
    if (!d) return 0;
    int count = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long step = parse_step_name(e->d_name);
        if (step < 0) continue;
        char marker[PATH_MAX];
        snprintf(marker, sizeof marker, "%s/%s/COMPLETE", run_dir, e->d_name);
        if (!is_file(marker)) continue;
        if (count == cap) *out = cg_realloc(*out, (size_t)(cap = cap ? 2 * cap : 16) * sizeof(long));
        (*out)[count++] = step;
    }
    closedir(d);
    if (count) qsort(*out, (size_t)count, sizeof(long), cmp_long);
    return count;
}

int ckpt_list(const char *run_dir, long *steps, int max) {
    long *all;
    int count = list_complete(run_dir, &all);
    for (int i = 0; i < count && i < max; i++) steps[i] = all[i];
    free(all);
    return count;
}

int ckpt_find_latest(const char *run_dir, char *out, size_t n) {
    long *all;
    int count = list_complete(run_dir, &all);
    if (count) ckpt_dir_name(run_dir, all[count - 1], out, n);
    free(all);
    return count > 0;
}

// ---- writing ----------------------------------------------------------------------------------

typedef struct FetchState {
    Ctx *ctx;
    const Tensor **src;   // per tensor: a device tensor to download, or NULL (host data given)
} FetchState;

static int fetch_tensor(void *user, int i, void *buf, size_t bytes, char *err, size_t n) {
    FetchState *fs = user;
    if (!fs->src[i] || tensor_bytes(fs->src[i]) != bytes) return cg_set_error(err, n, "state tensor %d: no data", i);
    tensor_download(fs->ctx, fs->src[i], buf);
    return 0;
}

static void state_tensor(StWriteTensor *w, const Tensor **src, int *k, const char *name,
                         const Tensor *t) {
    w[*k].name = name;
    w[*k].dtype = t->dtype == DTYPE_BF16 ? ST_BF16 : ST_F32;
    w[*k].ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) w[*k].shape[d] = t->shape[d];
    w[*k].data = t->device == DEVICE_CPU ? t->data : NULL;
    src[*k] = t;
    (*k)++;
}

static int write_state(const char *path, const ParamTable *params, const ParamTable *ema, Ctx *ctx,
                       const CkptState *s, bool sharded, char *err, size_t n) {
    if (!sharded && params->shard)   // a table keeping a shard writes it with dist_ckpt_write_shard_err
        return cg_set_error(err, n, "internal: %s: the whole optimizer state was asked of a table "
                            "that keeps a shard of it", path);
    int cap = 3 * params->n + (ema ? ema->n : 0) + 2, k = 0;
    StWriteTensor *w = cg_calloc((size_t)cap, sizeof(StWriteTensor));
    const Tensor **src = cg_calloc((size_t)cap, sizeof(Tensor *));
    char **names = cg_calloc((size_t)cap, sizeof(char *));
    for (int i = 0; i < params->n && !sharded; i++) {   // sharded: in the ranks' shard files
        const Param *p = params->params[i];
        size_t len = strlen(p->name) + 8;
        names[k] = cg_malloc(len);
        snprintf(names[k], len, "m.%s", p->name);
        state_tensor(w, src, &k, names[k], &p->m);
        names[k] = cg_malloc(len);
        snprintf(names[k], len, "v.%s", p->name);
        state_tensor(w, src, &k, names[k], &p->v);
        if (p->master.data) {   // bf16 values: the fp32 weights the optimizer updates
            names[k] = cg_malloc(len + 8);
            snprintf(names[k], len + 8, "master.%s", p->name);
            state_tensor(w, src, &k, names[k], &p->master);
        }
    }
    for (int i = 0; ema && i < ema->n; i++) {
        const Param *p = ema->params[i];
        size_t len = strlen(p->name) + 8;
        names[k] = cg_malloc(len);
        snprintf(names[k], len, "ema.%s", p->name);
        state_tensor(w, src, &k, names[k], p->master.data ? &p->master : &p->value);   // fp32 state
    }
    w[k] = (StWriteTensor){"rng", ST_U64, 2, {s->n_rngs, 4}, s->rngs};
    src[k++] = NULL;
    w[k] = (StWriteTensor){"cursor", ST_U8, 1, {(int64_t)s->cursor_bytes}, s->cursor};
    src[k++] = NULL;
    char step[32];
    snprintf(step, sizeof step, "%ld", s->step);
    StMeta meta[] = {{"format", STATE_FORMAT}, {"version", STATE_VERSION}, {"step", step},
                     {"optimizer", sharded ? "sharded" : "whole"}};
    FetchState fs = {ctx, src};
    int rc = st_write_err(path, w, k, meta, 4, fetch_tensor, &fs, err, n);
    for (int i = 0; i < cap; i++) free(names[i]);
    free(names);
    free(src);
    free(w);
    return rc;
}

// Writes a small text file and fsyncs it. text_cfg: the config (config_print), else the line.
static int write_text(const char *path, const Config *cfg, const char *line, char *err, size_t n) {
    FILE *f = fopen(path, "w");
    if (!f) return cg_set_error(err, n, "%s: %s", path, strerror(errno));
    if (cfg) config_print(cfg, f);
    else fputs(line, f);
    int bad = fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0;
    int e = errno;
    if (fclose(f) != 0 && !bad) bad = 1, e = errno;
    return bad ? cg_set_error(err, n, "%s: write: %s", path, strerror(e)) : 0;
}

static void hook(const CkptOptions *o, const char *path) {
    if (o && o->after_file) o->after_file(o->user, path);
}

// Removes complete checkpoints beyond the newest keep, never `keep_step`; and leftovers (.tmp,
// .old, .del folders) of steps below keep_step. Problems are warnings: the save succeeded.
static void prune(const char *run_dir, int keep, long keep_step) {
    DIR *d = opendir(run_dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {   // leftovers of interrupted saves and prunes
        const char *dot = strrchr(e->d_name, '.');
        if (!dot || strncmp(e->d_name, "step_", 5) != 0) continue;
        if (strcmp(dot, ".tmp") != 0 && strcmp(dot, ".old") != 0 && strcmp(dot, ".del") != 0) continue;
        char base[256];
        snprintf(base, sizeof base, "%.*s", (int)(dot - e->d_name), e->d_name);
        long step = parse_step_name(base);
        if (step < 0 || step >= keep_step) continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", run_dir, e->d_name);
        if (remove_tree(path) != 0)
            fprintf(stderr, "cgspn: warning: could not remove %s: %s\n", path, strerror(errno));
    }
    closedir(d);
    if (keep <= 0) return;
    long *all;
    int count = list_complete(run_dir, &all);
    int excess = count - keep;
    for (int i = 0; i < count && excess > 0; i++) {
        if (all[i] == keep_step) continue;
        char dir[PATH_MAX], del[PATH_MAX + 8];
        ckpt_dir_name(run_dir, all[i], dir, sizeof dir);
        snprintf(del, sizeof del, "%s.del", dir);
        // Renamed first, so a prune cut short never leaves a half-deleted "complete" checkpoint.
        if (rename(dir, del) != 0 || remove_tree(del) != 0)
            fprintf(stderr, "cgspn: warning: could not remove old checkpoint %s: %s\n", dir, strerror(errno));
        excess--;
    }
    free(all);
}

int ckpt_prepare_err(const char *run_dir, long step, char *tmp, size_t tmp_n, char *err, size_t n) {
    if (mkdir_p_err(run_dir, err, n) != 0) return -1;
    ckpt_tmp_dir_name(run_dir, step, tmp, tmp_n);
    if (remove_tree(tmp) != 0) return cg_set_error(err, n, "%s: removing a stale copy: %s", tmp, strerror(errno));
    if (mkdir(tmp, 0755) != 0) return cg_set_error(err, n, "%s: %s", tmp, strerror(errno));
    return 0;
}

int ckpt_save_err(const char *run_dir, const CkptOptions *o, const Config *c,
                  const ParamTable *params, const ParamTable *ema, Ctx *ctx, const CkptState *s,
                  char *saved, size_t saved_n, char *err, size_t n) {
    char final[PATH_MAX], tmp[PATH_MAX + 8], old[PATH_MAX + 8], path[PATH_MAX + 64];
    if (s->n_rngs < 0 || s->n_rngs > CKPT_MAX_RNGS || s->cursor_bytes > CKPT_CURSOR_MAX)
        return cg_set_error(err, n, "checkpoint state: %d RNGs / %zu cursor bytes exceed the limits (%d / %d)",
                    s->n_rngs, s->cursor_bytes, CKPT_MAX_RNGS, CKPT_CURSOR_MAX);
    const bool prepared = o && o->prepared, sharded = o && o->sharded_state;
    ckpt_dir_name(run_dir, s->step, final, sizeof final);
    snprintf(old, sizeof old, "%s.old", final);
    if (prepared) {   // made by ckpt_prepare_err; holds the ranks' optimizer shards already
        ckpt_tmp_dir_name(run_dir, s->step, tmp, sizeof tmp);
        if (!is_dir(tmp))
            return cg_set_error(err, n, "%s: the prepared checkpoint folder is missing", tmp);
    } else if (ckpt_prepare_err(run_dir, s->step, tmp, sizeof tmp, err, n) != 0) {
        return -1;
    }

    char step[32];
    snprintf(step, sizeof step, "%ld", s->step);
    StMeta meta[] = {{"format", "pt"}, {"producer", "cgspn"}, {"step", step}};
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    int rc = params_save_safetensors_err(params, ctx, path, meta, 3, err, n);
    if (rc == 0) {
        hook(o, path);
        snprintf(path, sizeof path, "%s/state.safetensors", tmp);
        rc = write_state(path, params, ema, ctx, s, sharded, err, n);
    }
    if (rc == 0) {
        hook(o, path);
        snprintf(path, sizeof path, "%s/config.cfg", tmp);
        rc = write_text(path, c, NULL, err, n);
    }
    if (rc == 0) {
        hook(o, path);
        char line[64];
        snprintf(line, sizeof line, "step %ld\n", s->step);
        snprintf(path, sizeof path, "%s/COMPLETE", tmp);
        rc = write_text(path, NULL, line, err, n);
    }
    if (rc == 0 && fsync_dir(tmp) != 0) rc = cg_set_error(err, n, "%s: fsync: %s", tmp, strerror(errno));
    if (rc == 0) hook(o, tmp);
    bool replaced = false;
    if (rc == 0 && is_dir(final)) {   // the same step again (a resumed run): swap it out
        if (remove_tree(old) != 0 || rename(final, old) != 0)
            rc = cg_set_error(err, n, "%s: moving the previous copy aside: %s", final, strerror(errno));
        else replaced = true;
    }
    if (rc == 0 && rename(tmp, final) != 0) {
        rc = cg_set_error(err, n, "%s: rename to %s: %s", tmp, final, strerror(errno));
        if (replaced) rename(old, final);
        replaced = false;
    }
    if (rc != 0) {
        remove_tree(tmp);
        append(err, n, "\n  hint: no checkpoint was written for step %ld (earlier ones are intact); "
               "free disk space in %s or set out_dir elsewhere", s->step, run_dir);
        return -1;
    }
    if (fsync_dir(run_dir) != 0)
        return cg_set_error(err, n, "%s: fsync: %s", run_dir, strerror(errno));
    if (replaced) remove_tree(old);
    prune(run_dir, o ? o->keep_last : 0, s->step);
    if (saved) snprintf(saved, saved_n, "%s", final);
    return 0;
}

void ckpt_save(const char *run_dir, const CkptOptions *o, const Config *c, const ParamTable *params,
               const ParamTable *ema, Ctx *ctx, const CkptState *s, char *saved, size_t saved_n) {
    char err[4096];
    if (ckpt_save_err(run_dir, o, c, params, ema, ctx, s, saved, saved_n, err, sizeof err) != 0)
        CG_FAIL("", "%s", err);
}

// ---- resolving and loading -----------------------------------------------------------------

int ckpt_resolve_err(const char *resume, const char *run_dir, char *out, size_t out_n, char *err,
                     size_t n) {
    if (!resume || !resume[0]) return 0;
    if (strcmp(resume, "auto") == 0) return ckpt_find_latest(run_dir, out, out_n);
    char marker[PATH_MAX];
    snprintf(marker, sizeof marker, "%s/COMPLETE", resume);
    if (is_file(marker)) {
        snprintf(out, out_n, "%s", resume);
        return 1;
    }
    if (!is_dir(resume))
        return cg_set_error(err, n, "resume = %s: no such checkpoint folder\n  hint: resume takes auto, a "
                    "checkpoint folder (RUN/step_NNNNNNNN) or a run folder", resume);
    if (ckpt_find_latest(resume, out, out_n)) return 1;
    size_t len = strlen(resume);
    const char *base = strrchr(resume, '/');
    base = base && base[1] ? base + 1 : resume;
    if (parse_step_name(base) >= 0 || (len > 4 && strcmp(resume + len - 4, ".tmp") == 0))
        return cg_set_error(err, n, "resume = %s: the checkpoint is incomplete (no COMPLETE marker: it was "
                    "being written when the run stopped)\n  hint: resume from an earlier one; "
                    "resume = auto picks the newest complete checkpoint", resume);
    return cg_set_error(err, n, "resume = %s: no complete checkpoint (step_NNNNNNNN/COMPLETE) in this "
                "folder", resume);
}

// Every "key = value" line of config_print's output for the model keys into a text buffer.
static char *config_text(const Config *c) {
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m) return NULL;
    config_print(c, m);
    fclose(m);
    return buf;
}

// The value config_print wrote for key (up to the end of its line) into out.
static void config_value(const char *text, const char *key, char *out, size_t n) {
    size_t kl = strlen(key);
    out[0] = 0;
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t ll = end ? (size_t)(end - line) : strlen(line);
        if (ll > kl && strncmp(line, key, kl) == 0 && (line[kl] == ' ' || line[kl] == '=')) {
            const char *v = memchr(line, '=', ll);
            if (v) {
                v++;
                while (*v == ' ') v++;
                snprintf(out, n, "%.*s", (int)(line + ll - v), v);
            }
            return;
        }
        line = end ? end + 1 : NULL;
    }
}

// Replaces the hint of err by one naming the model keys that differ from the checkpoint's config.
static void add_config_hint(const char *ckpt_dir, const Config *c, char *err, size_t n) {
    char path[PATH_MAX], e2[1024];
    snprintf(path, sizeof path, "%s/config.cfg", ckpt_dir);
    Config saved;
    config_defaults(&saved);
    if (config_load_file_err(&saved, path, e2, sizeof e2) != 0) return;   // keep the generic hint
    char *a = config_text(&saved), *b = config_text(c);
    if (!a || !b) {
        free(a);
        free(b);
        return;
    }
    char was[1024] = "", now[1024] = "";
    for (size_t i = 0; i < sizeof kModelKeys / sizeof kModelKeys[0]; i++) {
        char va[CONFIG_STR_MAX + 4], vb[CONFIG_STR_MAX + 4];
        config_value(a, kModelKeys[i], va, sizeof va);
        config_value(b, kModelKeys[i], vb, sizeof vb);
        if (strcmp(va, vb) == 0) continue;
        append(was, sizeof was, "%s%s = %s", was[0] ? ", " : "", kModelKeys[i], va);
        append(now, sizeof now, "%s%s = %s", now[0] ? ", " : "", kModelKeys[i], vb);
    }
    free(a);
    free(b);
    char *h = strstr(err, "\n  hint:");
    if (h) *h = 0;
    if (was[0])
        append(err, n, "\n  hint: resuming cannot change the model's shapes: the checkpoint was written "
               "with %s (%s), this run has %s; resume with that config, or start a new run "
               "(resume = \"\")", was, path, now);
    else
        append(err, n, "\n  hint: resuming cannot change the model's shapes; resume with the "
               "checkpoint's config (%s), or start a new run (resume = \"\")", path);
}

static const StTensor *state_find(const StFile *f, const char *prefix, const char *name) {
    char full[PARAM_NAME_MAX + 16];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    return st_find(f, full);
}

// The state tensor for t exists with t's dtype and exact shape.
static int check_state_tensor(const StFile *f, const StTensor *st, const char *prefix,
                              const char *name, const Tensor *t, char *err, size_t n) {
    char a[128], b[128];
    if (!st)
        return cg_set_error(err, n, "%s: no tensor %s%s\n  hint: the state file is from another model or "
                    "corrupt", f->path, prefix, name);
    bool same = st->ndim == t->ndim && st->numel == t->numel;
    for (int d = 0; same && d < t->ndim; d++) same = st->shape[d] == t->shape[d];
    StDType want = t->dtype == DTYPE_BF16 ? ST_BF16 : ST_F32;
    if (!same)
        return cg_set_error(err, n, "%s: tensor %s has shape %s, the config expects %s", f->path, st->name,
                    st_shape_str(st, a, sizeof a), tensor_shape_str(t, b, sizeof b));
    if (st->dtype != want)
        return cg_set_error(err, n, "%s: tensor %s has dtype %s, expected %s", f->path, st->name,
                    st_dtype_name(st->dtype), st_dtype_name(want));
    return 0;
}

static int load_state(const char *path, ParamTable *params, ParamTable *ema, Ctx *ctx, CkptState *s,
                      char *err, size_t n) {
    StFile f;
    if (st_open_err(&f, path, err, n) != 0) return -1;
    int rc = 0;
    const char *format = st_meta(&f, "format"), *version = st_meta(&f, "version");
    const char *step = st_meta(&f, "step");
    char *end = NULL;
    long stepv = step ? strtol(step, &end, 10) : -1;
    if (!format || strcmp(format, STATE_FORMAT) != 0 || !version || strcmp(version, STATE_VERSION) != 0)
        rc = cg_set_error(err, n, "%s: not a cgspn training state (format %s, version %s; expected %s, %s)",
                  path, format ? format : "absent", version ? version : "absent", STATE_FORMAT,
                  STATE_VERSION);
    else if (!step || *end || stepv < 0)
        rc = cg_set_error(err, n, "%s: metadata step '%s' is not a step count", path, step ? step : "");
    // optimizer = sharded: the moments and masters are in the ranks' shard files (the caller's).
    const char *optimizer = st_meta(&f, "optimizer");
    const bool sharded = optimizer && strcmp(optimizer, "sharded") == 0;
    for (int i = 0; i < params->n && rc == 0 && !sharded; i++) {
        Param *p = params->params[i];
        rc = check_state_tensor(&f, state_find(&f, "m.", p->name), "m.", p->name, &p->m, err, n);
        if (rc == 0)
            rc = check_state_tensor(&f, state_find(&f, "v.", p->name), "v.", p->name, &p->v, err, n);
    }
    // fp32 master weights: into the masters of a bf16 table; into the values of an fp32 one
    // (more precise than the bf16 values in model.safetensors). A checkpoint of an fp32 run has
    // none: bf16 masters then start from the weights just loaded.
    bool has_master = !sharded && params->n > 0 && state_find(&f, "master.", params->params[0]->name);
    for (int i = 0; has_master && i < params->n && rc == 0; i++) {
        Param *p = params->params[i];
        Tensor want = p->value;
        want.dtype = DTYPE_F32;
        rc = check_state_tensor(&f, state_find(&f, "master.", p->name), "master.", p->name, &want, err, n);
        if (rc == 0 && !params->masters && p->value.dtype != DTYPE_F32)
            rc = cg_set_error(err, n, "%s: parameter %s is %s; master weights load into fp32 tensors",
                              path, p->name, dtype_name(p->value.dtype));
    }
    bool has_ema = ema && ema->n > 0 && state_find(&f, "ema.", ema->params[0]->name);
    for (int i = 0; has_ema && i < ema->n && rc == 0; i++) {
        Param *p = ema->params[i];
        rc = check_state_tensor(&f, state_find(&f, "ema.", p->name), "ema.", p->name,
                                p->master.data ? &p->master : &p->value, err, n);
    }
    const StTensor *rng = st_find(&f, "rng"), *cursor = st_find(&f, "cursor");
    if (rc == 0 && (!rng || rng->dtype != ST_U64 || rng->ndim != 2 || rng->shape[1] != 4 ||
                    rng->shape[0] > CKPT_MAX_RNGS))
        rc = cg_set_error(err, n, "%s: tensor rng is missing or not U64 (n <= %d, 4)", path, CKPT_MAX_RNGS);
    if (rc == 0 && (!cursor || cursor->dtype != ST_U8 || cursor->ndim != 1 ||
                    cursor->shape[0] > CKPT_CURSOR_MAX))
        rc = cg_set_error(err, n, "%s: tensor cursor is missing or not U8 (n <= %d)", path, CKPT_CURSOR_MAX);
    if (rc == 0) {   // everything checked: fill
        // Into the table's layout: every element, or this rank's shard of a whole checkpoint's
        // state (zero = 1 resuming a checkpoint of one process or of zero = 0).
        for (int i = 0; i < params->n && !sharded; i++) {
            Param *p = params->params[i];
            params_upload_state(params, ctx, PARAM_STATE_M, i, st_data(&f, state_find(&f, "m.", p->name)));
            params_upload_state(params, ctx, PARAM_STATE_V, i, st_data(&f, state_find(&f, "v.", p->name)));
        }
        for (int i = 0; has_master && i < params->n; i++) {
            Param *p = params->params[i];
            const void *data = st_data(&f, state_find(&f, "master.", p->name));
            if (params->masters) params_upload_state(params, ctx, PARAM_STATE_MASTER, i, data);
            else tensor_upload(ctx, &p->value, data);
        }
        for (int i = 0; has_ema && i < ema->n; i++) {
            Param *p = ema->params[i];
            const void *data = st_data(&f, state_find(&f, "ema.", p->name));
            if (p->master.data) {   // a bf16 table: the fp32 average, and its values rounded
                tensor_upload(ctx, &p->master, data);
                tensor_upload_f32(ctx, &p->value, data);
            } else {
                tensor_upload(ctx, &p->value, data);
            }
        }
        s->step = stepv;
        s->n_rngs = (int)rng->shape[0];
        memcpy(s->rngs, st_data(&f, rng), rng->end - rng->begin);
        s->cursor_bytes = cursor->numel;
        memcpy(s->cursor, st_data(&f, cursor), cursor->numel);
        s->ema_loaded = has_ema;
        s->optimizer_sharded = sharded;
    }
    st_close(&f);
    return rc;
}

int ckpt_load_err(const char *ckpt_dir, const Config *c, ParamTable *params, ParamTable *ema,
                  Ctx *ctx, CkptState *s, char *err, size_t n) {
    char path[PATH_MAX];
    memset(s, 0, sizeof *s);
    snprintf(path, sizeof path, "%s/COMPLETE", ckpt_dir);
    if (!is_file(path))
        return cg_set_error(err, n, "%s: not a complete checkpoint (no COMPLETE marker)\n  hint: it was "
                    "being written when the run stopped; resume from an earlier one (resume = auto "
                    "picks the newest complete checkpoint)", ckpt_dir);
    snprintf(path, sizeof path, "%s/model.safetensors", ckpt_dir);
    LoadReport r = {0};
    if (params_load_safetensors_err(params, ctx, path, NULL, &r, err, n) != 0) {
        load_report_free(&r);
        add_config_hint(ckpt_dir, c, err, n);
        return -1;
    }
    if (r.n_extra) {
        cg_set_error(err, n, "%s: %d tensors of the checkpoint are not parameters of this model: ", path,
             r.n_extra);
        for (int i = 0; i < r.n_extra && i < LIST_SHOWN; i++) append(err, n, "%s%s", i ? ", " : "", r.extra[i]);
        if (r.n_extra > LIST_SHOWN) append(err, n, ", ... and %d more", r.n_extra - LIST_SHOWN);
        load_report_free(&r);
        add_config_hint(ckpt_dir, c, err, n);
        return -1;
    }
    load_report_free(&r);
    snprintf(path, sizeof path, "%s/state.safetensors", ckpt_dir);
    if (load_state(path, params, ema, ctx, s, err, n) != 0) return -1;
    const char *base = strrchr(ckpt_dir, '/');
    base = base && base[1] ? base + 1 : ckpt_dir;
    long named = parse_step_name(base);
    if (named >= 0 && named != s->step)
        return cg_set_error(err, n, "%s: the state is of step %ld, the folder name says %ld", ckpt_dir,
                    s->step, named);
    return 0;
}

void ckpt_load(const char *ckpt_dir, const Config *c, ParamTable *params, ParamTable *ema, Ctx *ctx,
               CkptState *s) {
    char err[4096];
    if (ckpt_load_err(ckpt_dir, c, params, ema, ctx, s, err, sizeof err) != 0) CG_FAIL("", "%s", err);
}

// ---- init weights -------------------------------------------------------------------------------

static bool has_prefix(const char *name, const char *prefix) {
    return prefix && strncmp(name, prefix, strlen(prefix)) == 0;
}

int ckpt_load_init_err(const char *init, ParamTable *params, Ctx *ctx, const char *optional_prefix,
                       const char *what, FILE *f, char *err, size_t n) {
    char path[1200], e2[4096];
    struct stat sb;
    if (stat(init, &sb) != 0)
        return cg_set_error(err, n, "init = %s: %s", init, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        char ckpt[1024];
        int found = ckpt_resolve_err(init, "", ckpt, sizeof ckpt, e2, sizeof e2);
        if (found <= 0)
            return cg_set_error(err, n, "init: %s", found < 0 ? e2 : "no complete checkpoint there");
        snprintf(path, sizeof path, "%s/model.safetensors", ckpt);
    } else {
        snprintf(path, sizeof path, "%s", init);
    }
    LoadReport r = {.allow_missing = true};
    int rc = 0;
    if (params_load_safetensors_err(params, ctx, path, NULL, &r, e2, sizeof e2) != 0)
        rc = cg_set_error(err, n, "init: %s\n  hint: init must be weights of this model (the same "
                          "model keys)", e2);
    for (int i = 0; rc == 0 && i < r.n_missing; i++)
        if (!has_prefix(r.missing[i], optional_prefix))
            rc = cg_set_error(err, n, "init: %s has no tensor %s\n  hint: init must be weights of "
                              "this model (the same model keys)", path, r.missing[i]);
    for (int i = 0; rc == 0 && i < r.n_extra; i++)
        if (!has_prefix(r.extra[i], optional_prefix))
            rc = cg_set_error(err, n, "init: %s holds %s, which is not a parameter of this model\n  "
                              "hint: init must be weights of this model (the same model keys)", path,
                              r.extra[i]);
    if (rc == 0 && f) {
        fprintf(f, "%s init from %s: ", what, path);
        load_report_print(&r, f);
    }
    load_report_free(&r);
    return rc;
}

void ckpt_load_init(const char *init, ParamTable *params, Ctx *ctx, const char *optional_prefix,
                    const char *what, FILE *f) {
    char err[4096];
    if (ckpt_load_init_err(init, params, ctx, optional_prefix, what, f, err, sizeof err) != 0)
        CG_FAIL("", "%s", err);
}
