// Shard building: see build.h.
#include "build.h"
#include "dataset.h"
#include "resize.h"
#include "shard_format.h"
#include "shard_writer.h"
#include "data_err.h"
#include "../kernels/error.h"
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

#define MSG_BYTES 768
#define MAX_REPORTED 100   // skipped images printed one by one; the rest only counted

typedef struct Item {
    uint8_t *frame;        // compressed record (malloc'd), NULL when failed
    size_t bytes;
    int height, width, label, warning, failed;
    PixelStats stats;
    char msg[MSG_BYTES];
} Item;

typedef struct Worker {
    ZSTD_CCtx *cctx;
    ResizeScratch rs;
    uint8_t *pix, *zbuf;
    size_t pix_cap, zcap;
} Worker;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *duration(double s, char *buf, size_t n) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, n, "%lds", t);
    return buf;
}

static void progress(const BuildOptions *o, uint64_t done, uint64_t total, double t0,
                     double *last, int final) {
    if (!o->progress) return;
    int tty = isatty(2);
    double t = now();
    if (!final && t - *last < (tty ? 0.2 : 10.0)) return;
    *last = t;
    double rate = done / fmax(t - t0, 1e-9);
    char eta[32], el[32];
    fprintf(stderr, "%sbuild %s: %llu/%llu images (%.1f%%) | %.0f img/s | %s %s%s",
            tty ? "\r\033[K" : "", o->split, (unsigned long long)done,
            (unsigned long long)total, total ? 100.0 * done / total : 100.0, rate,
            final ? "took" : "ETA",
            final ? duration(t - t0, el, sizeof el)
                  : duration(rate > 0 ? (total - done) / rate : 0, eta, sizeof eta),
            tty && !final ? "" : "\n");
}

static int mkdir_p(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

// The stored image: the source rectangle to keep and the stored height and width.
static void stored_shape(const BuildOptions *o, int h, int w, float *box, int *sh, int *sw) {
    int S = o->size;
    if (o->layout == SHARD_LAYOUT_SQUARE) {
        int side = h < w ? h : w;
        box[0] = (float)((w - side) / 2), box[1] = (float)((h - side) / 2);
        box[2] = box[3] = (float)side;
        *sh = *sw = S;
        return;
    }
    int shorter = h < w ? h : w, longer = h < w ? w : h;
    int keep = longer;
    double cap = (double)o->max_aspect * shorter;
    if (keep > cap) keep = (int)cap < shorter ? shorter : (int)cap;
    int out_long = (int)nearbyint((double)keep * S / shorter);
    if (out_long < S) out_long = S;
    if (out_long > SHARD_MAX_SIDE) {   // keep less of the long side rather than exceed the limit
        out_long = SHARD_MAX_SIDE;
        keep = (int)((double)out_long * shorter / S);
    }
    if (h <= w) {
        box[0] = (float)((w - keep) / 2), box[1] = 0, box[2] = (float)keep, box[3] = (float)h;
        *sh = S, *sw = out_long;
    } else {
        box[0] = 0, box[1] = (float)((h - keep) / 2), box[2] = (float)w, box[3] = (float)keep;
        *sh = out_long, *sw = S;
    }
}

static void process(const BuildSource *src, const BuildOptions *o, uint64_t i, Item *it,
                    Worker *wk) {
    memset(it, 0, sizeof *it);
    Image im;
    if (src->get(src->ctx, i, o->channels, o->size, &im, &it->label, &it->warning, it->msg,
                 sizeof it->msg)) {
        it->failed = 1;
        return;
    }
    float box[4];
    int sh, sw;
    stored_shape(o, im.height, im.width, box, &sh, &sw);
    size_t bytes = (size_t)sh * sw * o->channels;
    if (wk->pix_cap < bytes) {
        free(wk->pix);
        wk->pix = cg_malloc(bytes);
        wk->pix_cap = bytes;
    }
    resize_crop_u8(im.pixels, im.height, im.width, o->channels, box[0], box[1], box[2], box[3],
                   wk->pix, sh, sw, RESIZE_BICUBIC, &wk->rs);
    image_free(&im);
    pixel_stats(wk->pix, sh, sw, o->channels, &it->stats);
    size_t z = shard_compress_record(wk->cctx, o->zstd_level, wk->pix, bytes, &wk->zbuf, &wk->zcap,
                                     it->msg, sizeof it->msg);
    if (!z) {
        it->failed = 1;
        return;
    }
    it->frame = cg_malloc(z);
    memcpy(it->frame, wk->zbuf, z);
    it->bytes = z;
    it->height = sh, it->width = sw;
}

static void shard_name(const char *split, int no, char *out, size_t n) {
    snprintf(out, n, "%s-%05d%s", split, no, SHARD_EXT);
}

int build_shards(const BuildSource *src, const BuildOptions *o, BuildStats *st, char *err,
                 size_t n) {
    memset(st, 0, sizeof *st);
    st->ignored = src->ignored;
    if (o->channels != 1 && o->channels != 3)
        return data_fail(err, n, "%d channels requested; shards hold 1 or 3", o->channels);
    if (o->size < 1 || o->size > SHARD_MAX_SIDE)
        return data_fail(err, n, "size %d; expected 1..%d", o->size, SHARD_MAX_SIDE);
    if (!o->split[0] || strchr(o->split, '/') || strlen(o->split) >= 64)
        return data_fail(err, n, "split name '%s'; expected a short name without '/'", o->split);
    if (src->count == 0) return data_fail(err, n, "no images to build the %s split from", o->split);
    if (mkdir_p(o->out_dir))
        return data_fail(err, n, "%s: cannot create the folder: %s", o->out_dir, strerror(errno));
    char path[4096], name[128];
    manifest_path(o->out_dir, o->split, path, sizeof path);
    if (unlink(path) != 0 && errno != ENOENT)   // the old build is invalid from here on
        return data_fail(err, n, "%s: cannot remove the old manifest: %s", path, strerror(errno));

    int T = o->threads > 0 ? o->threads : omp_get_max_threads();
    Worker *wk = cg_calloc((size_t)T, sizeof(Worker));
    for (int t = 0; t < T; t++) wk[t].cctx = ZSTD_createCCtx();
    size_t chunk = (size_t)T * 32 < 256 ? 256 : (size_t)T * 32;
    Item *items = cg_calloc(chunk, sizeof(Item));

    Manifest m = {0};
    snprintf(m.split, sizeof m.split, "%s", o->split);
    m.channels = o->channels, m.image_size = o->size, m.layout = o->layout;
    m.num_classes = src->num_classes;
    m.class_names = src->class_names;
    int shard_cap = 16;
    m.shard_files = cg_calloc((size_t)shard_cap, sizeof(char *));
    m.shard_images = cg_calloc((size_t)shard_cap, sizeof(uint64_t));
    double sum[3] = {0}, sumsq[3] = {0};
    uint64_t pixels = 0;

    ShardWriter w;
    int open_writer = 0, rc = -1;
    ShardInfo info = {o->channels, o->size, o->layout, src->num_classes,
                      (const char *const *)src->class_names, 0};
    double t0 = now(), last = 0;
    if (isatty(2)) progress(o, 0, src->count, t0, &last, 0);
    for (uint64_t start = 0; start < src->count; start += chunk) {
        size_t cnt = src->count - start < chunk ? (size_t)(src->count - start) : chunk;
        #pragma omp parallel for schedule(dynamic, 1) num_threads(T)
        for (size_t k = 0; k < cnt; k++)
            process(src, o, start + k, &items[k], &wk[omp_get_thread_num()]);
        for (size_t k = 0; k < cnt; k++) {
            Item *it = &items[k];
            if (it->failed) {
                if (o->strict) {
                    data_fail(err, n, "%s\n  hint: without --strict unreadable images are "
                              "skipped and counted", it->msg);
                    goto fail;
                }
                if (st->skipped++ < MAX_REPORTED) {
                    if (o->progress && isatty(2)) fprintf(stderr, "\r\033[K");
                    fprintf(stderr, "cgspn: skipped %s\n", it->msg);
                }
                continue;
            }
            if (it->warning && st->warnings++ < MAX_REPORTED) {
                if (o->progress && isatty(2)) fprintf(stderr, "\r\033[K");
                fprintf(stderr, "cgspn: %s: decoded with warnings (damaged data recovered)\n",
                        src->name(src->ctx, start + k));
            }
            if (!open_writer) {
                if (m.num_shards == shard_cap) {
                    shard_cap *= 2;
                    m.shard_files = cg_realloc(m.shard_files, sizeof(char *) * shard_cap);
                    m.shard_images = cg_realloc(m.shard_images, sizeof(uint64_t) * shard_cap);
                }
                shard_name(o->split, m.num_shards, name, sizeof name);
                snprintf(path, sizeof path, "%s/%s", o->out_dir, name);
                info.shard_no = m.num_shards;
                if (shard_writer_open(&w, path, &info, err, n)) goto fail;
                open_writer = 1;
            }
            if (shard_writer_add(&w, it->frame, it->bytes, it->height, it->width, it->label,
                                 &it->stats, err, n))
                goto fail;
            for (int c = 0; c < 3; c++) sum[c] += it->stats.sum[c], sumsq[c] += it->stats.sumsq[c];
            pixels += it->stats.pixels;
            st->images++;
            if (shard_writer_bytes(&w) >= o->shard_bytes) {
                uint64_t recs = w.records, bytes = shard_writer_bytes(&w);
                if (shard_writer_finish(&w, err, n)) { open_writer = 0; goto fail; }
                open_writer = 0;
                m.shard_files[m.num_shards] = cg_strdup(name);
                m.shard_images[m.num_shards++] = recs;
                st->bytes += bytes;
            }
        }
        for (size_t k = 0; k < cnt; k++) free(items[k].frame), items[k].frame = NULL;
        progress(o, start + cnt, src->count, t0, &last, 0);
    }
    if (open_writer) {
        uint64_t recs = w.records, bytes = shard_writer_bytes(&w);
        open_writer = 0;
        if (shard_writer_finish(&w, err, n)) goto fail;
        m.shard_files[m.num_shards] = cg_strdup(name);
        m.shard_images[m.num_shards++] = recs;
        st->bytes += bytes;
    }
    if (st->images == 0) {
        data_fail(err, n, "none of the %llu images of the %s split could be read (%llu skipped)",
                  (unsigned long long)src->count, o->split, (unsigned long long)st->skipped);
        goto fail;
    }
    m.images = st->images;
    manifest_set_stats(&m, sum, sumsq, pixels);
    if (manifest_write(&m, o->out_dir, err, n)) goto fail;
    // Shards of an earlier, larger build of this split are no longer listed: remove them.
    for (int k = m.num_shards;; k++) {
        shard_name(o->split, k, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", o->out_dir, name);
        if (unlink(path) != 0) break;
    }
    st->shards = m.num_shards;
    rc = 0;
    goto done;
fail:
    if (open_writer) shard_writer_abort(&w);
    for (int k = 0; k < m.num_shards; k++) {   // a failed build leaves none of its shards
        snprintf(path, sizeof path, "%s/%s", o->out_dir, m.shard_files[k]);
        unlink(path);
    }
done:
    progress(o, st->images + st->skipped, src->count, t0, &last, 1);
    st->seconds = now() - t0;
    for (size_t k = 0; k < chunk; k++) free(items[k].frame);
    free(items);
    for (int t = 0; t < T; t++) {
        ZSTD_freeCCtx(wk[t].cctx);
        resize_scratch_free(&wk[t].rs);
        free(wk[t].pix);
        free(wk[t].zbuf);
    }
    free(wk);
    for (int k = 0; k < m.num_shards; k++) free(m.shard_files[k]);
    free(m.shard_files);
    free(m.shard_images);
    return rc;
}
