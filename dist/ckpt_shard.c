// Sharded optimizer state in checkpoint folders (dist/ckpt_shard.h).
#include "ckpt_shard.h"
#include "../kernels/ops.h"
#include "../kernels/error.h"
#include "../nn/safetensors.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHARD_FORMAT  "cgspn-optimizer-shard"
#define SHARD_VERSION "1"

enum { KIND_M, KIND_V, KIND_MASTER, N_KINDS };
static const char *const kKindPrefix[N_KINDS] = {"m.", "v.", "master."};

void dist_ckpt_shard_path(const char *dir, int rank, int world, char *out, size_t n) {
    snprintf(out, n, "%s/state.rank%05d-of%05d.safetensors", dir, rank, world);
}

// KIND_M, KIND_V, KIND_MASTER are nn/params.h's ParamState in the same order.
_Static_assert(KIND_M == (int)PARAM_STATE_M && KIND_V == (int)PARAM_STATE_V &&
               KIND_MASTER == (int)PARAM_STATE_MASTER, "shard kinds follow ParamState");

typedef struct ShardFetch {
    const DistGrads *g;
    int kinds;
} ShardFetch;

static int fetch_piece(void *user, int i, void *buf, size_t bytes, char *err, size_t n) {
    const ShardFetch *f = user;
    const ParamSegment *s = &f->g->seg[i / f->kinds];
    const Param *p = f->g->t->params[s->param];
    Tensor v = params_state_view(f->g->t, (ParamState)(i % f->kinds), s->param, s->start, s->len);
    if (bytes != v.numel * sizeof(float))
        return cg_set_error(err, n, "internal: %s piece of %zu bytes, expected %zu", p->name, bytes,
                            v.numel * sizeof(float));
    tensor_download(f->g->ctx, &v, buf);
    return 0;
}

int dist_ckpt_write_shard_err(const DistGrads *g, const char *dir, char *err, size_t n) {
    const Dist *d = g->d;
    if (!g->zero)
        return cg_set_error(err, n, "optimizer shards are written with zero = 1 only (with zero = 0 "
                            "rank 0 writes the whole state)");
    const int kinds = g->t->masters ? 3 : 2;
    const int count = g->n_seg * kinds;
    StWriteTensor *w = cg_calloc((size_t)(count ? count : 1), sizeof *w);
    char **names = cg_calloc((size_t)(count ? count : 1), sizeof *names);
    for (int i = 0; i < count; i++) {
        const ParamSegment *s = &g->seg[i / kinds];
        const Param *p = g->t->params[s->param];
        size_t len = strlen(p->name) + 32;
        names[i] = cg_malloc(len);
        snprintf(names[i], len, "%s%s@%zu", kKindPrefix[i % kinds], p->name, s->start);
        w[i] = (StWriteTensor){names[i], ST_F32, 1, {(int64_t)s->len}, NULL};
    }
    char path[1200], rank[16], world[16];
    dist_ckpt_shard_path(dir, d->rank, d->world, path, sizeof path);
    snprintf(rank, sizeof rank, "%d", d->rank);
    snprintf(world, sizeof world, "%d", d->world);
    StMeta meta[] = {{"format", SHARD_FORMAT}, {"version", SHARD_VERSION}, {"rank", rank},
                     {"world", world}};
    ShardFetch f = {g, kinds};
    int rc = st_write_err(path, w, count, meta, 4, fetch_piece, &f, err, n);
    for (int i = 0; i < count; i++) free(names[i]);
    free(names);
    free(w);
    return rc;
}

static int fsync_path(const char *path, int flags) {
    int fd = open(path, flags | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

int dist_ckpt_commit_err(Dist *d, const char *dir, int ok, char *err, size_t n) {
    int bad = dist_first_failed(d, ok, "the checkpoint's shard commit");
    if (bad >= 0)
        return cg_set_error(err, n, "rank %d could not write its optimizer shard into %s (its own "
                            "output has the error); the checkpoint is incomplete", bad, dir);
    int wrote = 1;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, DIST_CKPT_MARKER);
    if (d->rank == 0) {
        FILE *f = fopen(path, "w");
        wrote = f != NULL;
        if (f) {
            fprintf(f, "world %d\n", d->world);
            wrote = fflush(f) == 0 && fsync(fileno(f)) == 0;
            wrote &= fclose(f) == 0;
        }
        wrote = wrote && fsync_path(dir, O_RDONLY | O_DIRECTORY) == 0;
        if (!wrote) cg_set_error(err, n, "%s: %s", path, strerror(errno));
    }
    bad = dist_first_failed(d, wrote, "the checkpoint's shard marker");
    if (bad >= 0 && d->rank != 0)
        return cg_set_error(err, n, "rank 0 could not write %s; the checkpoint is incomplete", path);
    return bad >= 0 ? -1 : 0;
}

int dist_ckpt_shards_complete(const char *dir, int *world) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, DIST_CKPT_MARKER);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int w = 0, k = fscanf(f, "world %d", &w);
    fclose(f);
    if (k != 1 || w < 1) return 0;
    for (int r = 0; r < w; r++) {
        struct stat sb;
        dist_ckpt_shard_path(dir, r, w, path, sizeof path);
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
    }
    if (world) *world = w;
    return 1;
}

// The parts of the table this rank restores: its shard (zero = 1) or every parameter.
static int wanted_segments(const DistGrads *g, ParamSegment **out) {
    if (g->zero) {
        *out = cg_malloc((size_t)(g->n_seg ? g->n_seg : 1) * sizeof **out);
        memcpy(*out, g->seg, (size_t)g->n_seg * sizeof **out);
        return g->n_seg;
    }
    *out = cg_malloc((size_t)(g->t->n ? g->t->n : 1) * sizeof **out);
    int k = 0;
    for (int i = 0; i < g->t->n; i++)
        if (g->t->params[i]->value.numel) (*out)[k++] = (ParamSegment){i, 0, g->t->params[i]->value.numel, 0};
    return k;
}

// Copies the overlap of a file piece [start, start + len) of parameter j into the wanted
// segments of j (first[j] .. first[j + 1] - 1 of seg); returns the elements copied.
static size_t copy_piece(DistGrads *g, const ParamSegment *seg, const int *first, int j, int kind,
                         size_t start, size_t len, const float *data, bool into_values) {
    const Param *p = g->t->params[j];
    size_t copied = 0;
    for (int s = first[j]; s < first[j + 1]; s++) {
        size_t a = seg[s].start > start ? seg[s].start : start;
        size_t e1 = seg[s].start + seg[s].len, e2 = start + len;
        size_t b = e1 < e2 ? e1 : e2;
        if (b <= a) continue;
        Tensor v = into_values ? dist_segment_view(&p->value, a, b - a)
                               : params_state_view(g->t, (ParamState)kind, j, a, b - a);
        if (into_values) tensor_upload_f32(g->ctx, &v, data + (a - start));
        else tensor_upload(g->ctx, &v, data + (a - start));
        copied += b - a;
    }
    return copied;
}

int dist_ckpt_read_shard_err(DistGrads *g, const char *dir, char *err, size_t n) {
    int old_world = 0;
    if (!dist_ckpt_shards_complete(dir, &old_world))
        return cg_set_error(err, n, "%s: no complete set of optimizer shards (%s and every "
                            "state.rankNNNNN-ofNNNNN.safetensors it names)", dir, DIST_CKPT_MARKER);
    ParamSegment *seg;
    const int nseg = wanted_segments(g, &seg);
    const ParamTable *t = g->t;
    int *first = cg_calloc((size_t)t->n + 1, sizeof(int));   // seg is in table order
    for (int s = 0, j = 0; j <= t->n; j++) {
        while (s < nseg && seg[s].param < j) s++;
        first[j] = s;
    }
    size_t want = 0, got[N_KINDS] = {0};
    for (int s = 0; s < nseg; s++) want += seg[s].len;
    const bool masters_to_values = t->masters == NULL;
    int rc = 0;
    float *buf = NULL;
    size_t buf_elems = 0;
    for (int r = 0; r < old_world && rc == 0; r++) {
        char path[1200];
        dist_ckpt_shard_path(dir, r, old_world, path, sizeof path);
        StFile f;
        if (st_open_err(&f, path, err, n) != 0) {
            rc = -1;
            break;
        }
        const char *fmt = st_meta(&f, "format");
        if (!fmt || strcmp(fmt, SHARD_FORMAT) != 0)
            rc = cg_set_error(err, n, "%s: not an optimizer shard (metadata format is %s)", path,
                              fmt ? fmt : "missing");
        for (int i = 0; i < f.n && rc == 0; i++) {
            const StTensor *st = &f.tensors[i];
            int kind = -1;
            for (int k = 0; k < N_KINDS && kind < 0; k++)
                if (strncmp(st->name, kKindPrefix[k], strlen(kKindPrefix[k])) == 0) kind = k;
            const char *at = strrchr(st->name, '@');
            if (kind < 0 || !at || st->dtype != ST_F32 || st->ndim != 1) {
                rc = cg_set_error(err, n, "%s: tensor %s is not a shard piece (KIND.NAME@START, F32, "
                                  "1-D)", path, st->name);
                break;
            }
            char name[PARAM_NAME_MAX];
            const char *base = st->name + strlen(kKindPrefix[kind]);
            size_t nlen = (size_t)(at - base);
            if (nlen >= sizeof name) nlen = sizeof name - 1;
            memcpy(name, base, nlen);
            name[nlen] = 0;
            char *end;
            size_t start = strtoull(at + 1, &end, 10);
            int j = -1;
            for (int q = 0; q < t->n && j < 0; q++)
                if (strcmp(t->params[q]->name, name) == 0) j = q;
            if (j < 0 || *end || start + st->numel > t->params[j]->value.numel) {
                rc = cg_set_error(err, n, "%s: piece %s does not fit this model (%s)\n  hint: the "
                                  "checkpoint was written for another model; resume with its config",
                                  path, st->name, j < 0 ? "no such parameter" : "out of range");
                break;
            }
            if (first[j] == first[j + 1]) continue;   // not this rank's
            bool into_values = kind == KIND_MASTER && masters_to_values;
            if (st->numel > buf_elems) {
                free(buf);
                buf = cg_malloc((buf_elems = st->numel) * sizeof(float));
            }
            memcpy(buf, st_data(&f, st), st->numel * sizeof(float));
            got[kind] += copy_piece(g, seg, first, j, kind, start, st->numel, buf, into_values);
        }
        st_close(&f);
    }
    if (rc == 0 && (got[KIND_M] != want || got[KIND_V] != want ||
                    (got[KIND_MASTER] && got[KIND_MASTER] != want)))
        rc = cg_set_error(err, n, "%s: the shards cover %zu, %zu and %zu of the %zu moment, moment and "
                          "master elements this rank needs\n  hint: the shard files are from different "
                          "checkpoints, or one is damaged", dir, got[KIND_M], got[KIND_V],
                          got[KIND_MASTER], want);
    free(buf);
    free(first);
    free(seg);
    // Masters of a bf16 run restored into an fp32 table's values: each rank restored its part.
    if (dist_first_failed(g->d, rc == 0, "the optimizer shard load") >= 0 && rc == 0)
        return cg_set_error(err, n, "another rank could not load its optimizer shard from %s (its "
                            "own output has the error)", dir);
    if (rc == 0 && masters_to_values && got[KIND_MASTER]) dist_gather_values(g);
    return rc;
}
