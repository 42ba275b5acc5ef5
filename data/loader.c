// Threaded loader: see loader.h.
//
// Batches are numbered by seq = 0, 1, ... from the cursor the threads were started at; batch
// seq lives in slot seq % R (R = prefetch + 1). A slot is set up for its seq when the caller
// releases the batch before it (R earlier); workers claim a few images of the lowest unclaimed
// seq at a time under the mutex, fill them without it, and the worker that completes a batch
// applies mixup/cutmix and marks it ready. Every random draw is seeded from (seed, epoch,
// image) or (seed, epoch, step, rank), never from which thread runs it.
#include "loader.h"
#include "data_err.h"
#include "shard_format.h"
#include "../kernels/error.h"
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

enum { PURPOSE_ORDER = 0x0de5, PURPOSE_AUG = 0xa06, PURPOSE_MIX = 0x31c };
#define CLAIM_PIXELS 65536   // images per claim: about this many output pixels, at most 16

typedef struct Slot {
    Batch b;
    int64_t seq;
    int claimed, done, ready;
} Slot;

typedef struct Perm { int64_t epoch; uint32_t *order; } Perm;

typedef struct Worker {
    Loader *l;
    ZSTD_DCtx *dctx;
    ResizeScratch rs;
    uint8_t *raw, *img, *tmp;
    size_t raw_cap;
    pthread_t thread;
} Worker;

struct Loader {
    LoaderOptions o;
    Dataset ds;
    int B, C, H, W, K, R, claim;
    int64_t spe;                 // steps per epoch
    float mean[3], std[3];
    uint8_t fill[3];
    Slot *slots;
    Perm *perms;
    int nperms;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_ready;
    LoaderCursor base;           // seq 0
    int64_t claim_seq, next_seq, held_seq;
    int stop, failed;
    char msg[1024];
    Worker *workers;
    int nworkers, running;
};

static void *dflt_alloc(size_t n) { return malloc(n); }

void loader_options_default(LoaderOptions *o) {
    memset(o, 0, sizeof *o);
    o->split = "train";
    o->train = 1;
    o->batch_size = 128;
    o->world = 1;
    o->img_size = 224;
    o->prefetch = 2;
    o->rrc_scale_min = 0.08f, o->rrc_scale_max = 1.0f;
    o->rrc_ratio_min = 3.0f / 4, o->rrc_ratio_max = 4.0f / 3;
    o->hflip = 0.5f;
    o->randaug_m = 9, o->randaug_mstd = 0.5f, o->randaug_inc = 1;
    o->mix = (MixConfig){0, 0, 1.0f, 0.5f, 0};
    o->eval_crop_pct = 0.875f;
    o->interp = RESIZE_BILINEAR;
}

void loader_epoch_order(uint64_t seed, int64_t epoch, uint32_t *order, uint32_t count) {
    for (uint32_t i = 0; i < count; i++) order[i] = i;
    Rng r;
    rng_seed_stream(&r, seed, PURPOSE_ORDER, (uint64_t)epoch);
    rng_shuffle_u32(&r, order, count);
}

// A stream for (seed, purpose, epoch, index): the epoch picks a sub-seed, the index a stream.
static void seed_stream(Rng *r, uint64_t seed, uint64_t purpose, int64_t epoch, uint64_t index) {
    Rng e;
    rng_seed_stream(&e, seed, purpose, (uint64_t)epoch);
    rng_seed_stream(r, rng_u64(&e), purpose, index);
}

// ---------------------------------------------------------------------------------------------
// Slots and claims (called with mu held)

static LoaderCursor seq_cursor(const Loader *l, int64_t seq) {
    int64_t t = l->base.step + seq;
    return (LoaderCursor){l->base.epoch + t / l->spe, t % l->spe};
}

static void slot_setup(Loader *l, int64_t seq) {
    Slot *s = &l->slots[seq % l->R];
    LoaderCursor c = seq_cursor(l, seq);
    int64_t first = c.step * (int64_t)l->o.batch_size + (int64_t)l->o.rank * l->B;
    int64_t left = (int64_t)l->ds.m.images - first;
    s->seq = seq;
    s->claimed = s->done = 0;
    s->b.count = left <= 0 ? 0 : left < l->B ? (int)left : l->B;
    s->b.epoch = c.epoch, s->b.step = c.step;
    s->b.lam = 1;
    s->ready = s->b.count == 0;
}

// The train order of epoch e, computed once and kept while batches of that epoch are in flight.
static const uint32_t *perm_for(Loader *l, int64_t epoch) {
    Perm *victim = &l->perms[0];
    for (int i = 0; i < l->nperms; i++) {
        if (l->perms[i].order && l->perms[i].epoch == epoch) return l->perms[i].order;
        if (!l->perms[i].order || (victim->order && l->perms[i].epoch < victim->epoch))
            victim = &l->perms[i];
    }
    if (!victim->order) victim->order = cg_malloc(sizeof(uint32_t) * l->ds.m.images);
    victim->epoch = epoch;
    loader_epoch_order(l->o.seed, epoch, victim->order, (uint32_t)l->ds.m.images);
    return victim->order;
}

// Claims up to l->claim images of the lowest unfinished seq: returns the slot and [*j0, *j1),
// or NULL when told to stop.
static Slot *claim(Loader *l, int *j0, int *j1) {
    for (;;) {
        if (l->stop || l->failed) return NULL;
        Slot *s = &l->slots[l->claim_seq % l->R];
        if (s->seq != l->claim_seq) {   // its buffer still holds a batch the caller has not released
            pthread_cond_wait(&l->cv_work, &l->mu);
            continue;
        }
        if (s->claimed >= s->b.count) {
            l->claim_seq++;
            continue;
        }
        *j0 = s->claimed;
        *j1 = s->claimed + l->claim < s->b.count ? s->claimed + l->claim : s->b.count;
        s->claimed = *j1;
        int64_t first = s->b.step * (int64_t)l->o.batch_size + (int64_t)l->o.rank * l->B;
        const uint32_t *order = l->o.train ? perm_for(l, s->b.epoch) : NULL;
        for (int j = *j0; j < *j1; j++)
            s->b.indices[j] = order ? order[first + j] : (uint32_t)(first + j);
        return s;
    }
}

// ---------------------------------------------------------------------------------------------
// One image

static int load_image(Worker *w, Slot *s, int j, char *err, size_t n) {
    Loader *l = w->l;
    uint64_t index = s->b.indices[j];
    int si;
    uint64_t rec;
    dataset_locate(&l->ds, index, &si, &rec);
    const Shard *sh = &l->ds.shards[si];
    ShardRecord r = shard_record(sh, rec);
    size_t bytes = (size_t)r.height * r.width * l->C;
    if (w->raw_cap < bytes) {
        free(w->raw);
        w->raw = cg_malloc(bytes);
        w->raw_cap = bytes;
    }
    if (shard_read_record(sh, rec, w->dctx, w->raw, w->raw_cap, err, n)) return -1;
    s->b.labels[j] = r.label;

    int H = l->H, W = l->W, C = l->C;
    float *out = s->b.images + (size_t)j * C * H * W;
    if (!l->o.train) {
        CropBox b = aug_eval_box(r.height, r.width, H, l->o.eval_crop_pct);
        resize_crop_u8(w->raw, r.height, r.width, C, b.x0, b.y0, b.w, b.h, w->img, H, W,
                       l->o.interp, &w->rs);
        aug_normalize(w->img, H, W, C, l->mean, l->std, out);
        return 0;
    }
    Rng rng;
    seed_stream(&rng, l->o.seed, PURPOSE_AUG, s->b.epoch, index);
    const LoaderOptions *o = &l->o;
    CropBox b = aug_rrc_box(&rng, r.height, r.width, o->rrc_scale_min, o->rrc_scale_max,
                            o->rrc_ratio_min, o->rrc_ratio_max);
    resize_crop_u8(w->raw, r.height, r.width, C, b.x0, b.y0, b.w, b.h, w->img, H, W, o->interp,
                   &w->rs);
    if (o->hflip > 0 && rng_uniform(&rng) < o->hflip) aug_hflip_u8(w->img, H, W, C);
    if (o->randaug_n > 0)
        randaugment_u8(w->img, H, W, C, o->randaug_n, o->randaug_m, o->randaug_mstd,
                       o->randaug_inc, l->fill, &rng, w->tmp);
    aug_normalize(w->img, H, W, C, l->mean, l->std, out);
    aug_random_erase(out, C, H, W, o->reprob, &rng);
    return 0;
}

// Batch-level work of a complete batch: mixing and targets.
static void finish_batch(Loader *l, Slot *s) {
    Batch *b = &s->b;
    b->lam = 1;
    float smoothing = 0;
    if (l->o.train) {
        Rng rng;
        seed_stream(&rng, l->o.seed, PURPOSE_MIX, b->epoch, (uint64_t)b->step * l->o.world + l->o.rank);
        b->lam = mix_batch(b->images, b->count, l->C, l->H, l->W, &l->o.mix, &rng);
        smoothing = l->o.mix.label_smoothing;
    }
    if (b->lam == 1) {   // plain targets (also what eval gets): one-hot, smoothed in training
        float off = smoothing / l->K, on = 1 - smoothing + off;
        for (int i = 0; i < b->count; i++) {
            float *t = b->targets + (size_t)i * l->K;
            for (int k = 0; k < l->K; k++) t[k] = off;
            t[b->labels[i]] = on;
        }
    } else {
        mix_targets(b->labels, b->count, l->K, b->lam, smoothing, b->targets);
    }
}

static void *worker_main(void *arg) {
    Worker *w = arg;
    Loader *l = w->l;
    char err[1024];
    pthread_mutex_lock(&l->mu);
    for (;;) {
        int j0, j1;
        Slot *s = claim(l, &j0, &j1);
        if (!s) break;
        pthread_mutex_unlock(&l->mu);
        int rc = 0;
        for (int j = j0; j < j1 && rc == 0; j++) rc = load_image(w, s, j, err, sizeof err);
        pthread_mutex_lock(&l->mu);
        if (rc) {
            if (!l->failed) snprintf(l->msg, sizeof l->msg, "%s", err);
            l->failed = 1;
            pthread_cond_broadcast(&l->cv_ready);
            pthread_cond_broadcast(&l->cv_work);
            break;
        }
        s->done += j1 - j0;
        if (s->done == s->b.count) {   // this thread completed the batch: no one else touches it
            pthread_mutex_unlock(&l->mu);
            finish_batch(l, s);
            pthread_mutex_lock(&l->mu);
            s->ready = 1;
            pthread_cond_broadcast(&l->cv_ready);
        }
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

// ---------------------------------------------------------------------------------------------
// Threads

static void stop_threads(Loader *l) {
    if (!l->running) return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < l->nworkers; i++) pthread_join(l->workers[i].thread, NULL);
    l->running = 0;
}

static int start_threads(Loader *l, LoaderCursor c, char *err, size_t n) {
    l->base = c;
    l->claim_seq = l->next_seq = 0;
    l->held_seq = -1;
    l->stop = l->failed = 0;
    for (int i = 0; i < l->R; i++) slot_setup(l, i);
    for (int i = 0; i < l->nworkers; i++) {
        if (pthread_create(&l->workers[i].thread, NULL, worker_main, &l->workers[i]) != 0) {
            l->nworkers = i;   // join those started
            l->running = 1;
            stop_threads(l);
            return data_fail(err, n, "cannot start loader thread %d: %s", i, strerror(errno));
        }
    }
    l->running = 1;
    return 0;
}

static int check_options(const LoaderOptions *o, char *err, size_t n) {
    if (o->world < 1 || o->rank < 0 || o->rank >= o->world)
        return data_fail(err, n, "loader: rank %d of world %d; expected 0 <= rank < world",
                         o->rank, o->world);
    if (o->batch_size < 1 || o->batch_size % o->world)
        return data_fail(err, n, "loader: batch_size %d does not split evenly over %d ranks",
                         o->batch_size, o->world);
    if (o->img_size < 1 || o->img_size > SHARD_MAX_SIDE)
        return data_fail(err, n, "loader: img_size %d; expected 1..%d", o->img_size, SHARD_MAX_SIDE);
    if (o->train && !(o->rrc_scale_min > 0 && o->rrc_scale_min <= o->rrc_scale_max &&
                      o->rrc_scale_max <= 1))
        return data_fail(err, n, "loader: rrc_scale_min %g / rrc_scale_max %g; expected 0 < min "
                         "<= max <= 1", o->rrc_scale_min, o->rrc_scale_max);
    if (o->train && !(o->rrc_ratio_min > 0 && o->rrc_ratio_min <= o->rrc_ratio_max))
        return data_fail(err, n, "loader: rrc_ratio_min %g / rrc_ratio_max %g; expected 0 < min "
                         "<= max", o->rrc_ratio_min, o->rrc_ratio_max);
    if (!(o->hflip >= 0 && o->hflip <= 1) || !(o->reprob >= 0 && o->reprob <= 1) ||
        !(o->mix.prob >= 0 && o->mix.prob <= 1) || !(o->mix.switch_prob >= 0 && o->mix.switch_prob <= 1))
        return data_fail(err, n, "loader: hflip %g, reprob %g, mixup_prob %g, mixup_switch_prob "
                         "%g; probabilities must be in [0, 1]", o->hflip, o->reprob, o->mix.prob,
                         o->mix.switch_prob);
    // m above 10 is allowed as in timm: each drawn magnitude is clipped to [0, 10].
    if (o->randaug_n < 0 || o->randaug_n > 64 || !(o->randaug_m >= 0 && o->randaug_m <= 100) ||
        !(o->randaug_mstd >= 0))
        return data_fail(err, n, "loader: randaug_n %d, randaug_m %g, randaug_mstd %g; expected "
                         "n in 0..64, m in [0, 100], mstd >= 0", o->randaug_n, o->randaug_m,
                         o->randaug_mstd);
    if (!(o->mix.mixup_alpha >= 0) || !(o->mix.cutmix_alpha >= 0) ||
        !(o->mix.label_smoothing >= 0 && o->mix.label_smoothing < 1))
        return data_fail(err, n, "loader: mixup_alpha %g, cutmix_alpha %g, label_smoothing %g; "
                         "expected alphas >= 0 and smoothing in [0, 1)", o->mix.mixup_alpha,
                         o->mix.cutmix_alpha, o->mix.label_smoothing);
    if (!(o->eval_crop_pct > 0 && o->eval_crop_pct <= 1))
        return data_fail(err, n, "loader: eval_crop_pct %g; expected (0, 1]", o->eval_crop_pct);
    if (o->prefetch < 1 || o->prefetch > 64 || o->threads < 0)
        return data_fail(err, n, "loader: prefetch %d, threads %d; expected prefetch 1..64 and "
                         "threads >= 0", o->prefetch, o->threads);
    return 0;
}

Loader *loader_open(const LoaderOptions *opt, char *err, size_t n) {
    if (check_options(opt, err, n)) return NULL;
    Loader *l = cg_calloc(1, sizeof *l);
    l->o = *opt;
    if (!l->o.alloc || !l->o.free) l->o.alloc = dflt_alloc, l->o.free = free;
    if (dataset_open(&l->ds, opt->dir, opt->split, err, n)) {
        free(l);
        return NULL;
    }
    const Manifest *m = &l->ds.m;
    int bad = 0;
    if (opt->channels && opt->channels != m->channels)
        bad = data_fail(err, n, "%s/%s: %d-channel images; the model expects %d (in_chans)\n  hint: "
                        "rebuild the shards with --channels %d, or set in_chans = %d", opt->dir,
                        opt->split, m->channels, opt->channels, opt->channels, m->channels);
    else if (opt->num_classes && opt->num_classes < m->num_classes)
        bad = data_fail(err, n, "%s/%s: %d classes; num_classes is %d\n  hint: set num_classes to "
                        "the shards' class count (--num_classes=%d)", opt->dir, opt->split,
                        m->num_classes, opt->num_classes, m->num_classes);
    else if (m->images > UINT32_MAX)
        bad = data_fail(err, n, "%s/%s: %llu images; the loader handles up to 2^32", opt->dir,
                        opt->split, (unsigned long long)m->images);
    l->B = opt->batch_size / opt->world;
    l->C = m->channels, l->H = l->W = opt->img_size;
    l->K = opt->num_classes ? opt->num_classes : m->num_classes;
    l->spe = opt->train ? (int64_t)(m->images / opt->batch_size)
                        : (int64_t)((m->images + opt->batch_size - 1) / opt->batch_size);
    if (!bad && l->spe == 0)
        bad = data_fail(err, n, "%s/%s: %llu images, fewer than one batch of %d\n  hint: lower "
                        "batch_size", opt->dir, opt->split, (unsigned long long)m->images,
                        opt->batch_size);
    for (int c = 0; !bad && c < l->C; c++) {
        l->mean[c] = opt->have_norm ? opt->mean[c] : (float)m->mean[c];
        l->std[c] = opt->have_norm ? opt->std[c] : (float)m->std[c];
        if (!(l->std[c] > 0))
            bad = data_fail(err, n, "%s/%s: channel %d has std %g; normalization needs std > 0%s",
                            opt->dir, opt->split, c, l->std[c], opt->have_norm ? "" :
                            "\n  hint: the images are constant; set data_mean and data_std");
        float f = nearbyintf(255 * l->mean[c]);
        l->fill[c] = (uint8_t)(f < 0 ? 0 : f > 255 ? 255 : f);
    }
    if (bad) {
        dataset_close(&l->ds);
        free(l);
        return NULL;
    }
    l->R = opt->prefetch + 1;
    l->claim = CLAIM_PIXELS / (l->H * l->W);
    l->claim = l->claim < 1 ? 1 : l->claim > 16 ? 16 : l->claim;
    l->slots = cg_calloc((size_t)l->R, sizeof(Slot));
    size_t img = (size_t)l->C * l->H * l->W;
    for (int i = 0; i < l->R; i++) {
        Batch *b = &l->slots[i].b;
        b->images = l->o.alloc(sizeof(float) * img * l->B);
        b->targets = l->o.alloc(sizeof(float) * (size_t)l->K * l->B);
        if (!b->images || !b->targets) CG_FAIL("lower batch_size or loader_prefetch",
                                               "out of memory for the loader's batch buffers");
        b->labels = cg_calloc((size_t)l->B, sizeof(int32_t));
        b->indices = cg_calloc((size_t)l->B, sizeof(uint32_t));
        b->channels = l->C, b->height = l->H, b->width = l->W, b->classes = l->K;
    }
    l->nperms = l->R + 2;
    l->perms = cg_calloc((size_t)l->nperms, sizeof(Perm));
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    l->nworkers = opt->threads > 0 ? opt->threads : cores > 0 ? (int)cores : 1;
    l->workers = cg_calloc((size_t)l->nworkers, sizeof(Worker));
    for (int i = 0; i < l->nworkers; i++) {
        Worker *w = &l->workers[i];
        w->l = l;
        w->dctx = ZSTD_createDCtx();
        w->img = cg_malloc(img);
        w->tmp = cg_malloc(img);
    }
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv_work, NULL);
    pthread_cond_init(&l->cv_ready, NULL);
    if (start_threads(l, (LoaderCursor){0, 0}, err, n)) {
        loader_close(l);
        return NULL;
    }
    return l;
}

const Batch *loader_next(Loader *l, char *err, size_t n) {
    pthread_mutex_lock(&l->mu);
    if (l->held_seq >= 0) {   // the caller is done with the previous batch: refill its slot
        slot_setup(l, l->held_seq + l->R);
        l->held_seq = -1;
        pthread_cond_broadcast(&l->cv_work);
    }
    Slot *s = &l->slots[l->next_seq % l->R];
    while (!s->ready && !l->failed) pthread_cond_wait(&l->cv_ready, &l->mu);
    if (!s->ready) {
        data_fail(err, n, "%s", l->msg);
        pthread_mutex_unlock(&l->mu);
        return NULL;
    }
    l->held_seq = l->next_seq++;
    pthread_mutex_unlock(&l->mu);
    return &s->b;
}

LoaderCursor loader_cursor_get(const Loader *l) { return seq_cursor(l, l->next_seq); }

int loader_cursor_set(Loader *l, LoaderCursor c, char *err, size_t n) {
    if (c.epoch < 0 || c.step < 0 || c.step >= l->spe)
        return data_fail(err, n, "loader cursor (epoch %lld, step %lld): expected epoch >= 0 and "
                         "0 <= step < %lld (steps per epoch)\n  hint: the checkpoint was written "
                         "with another batch_size or dataset", (long long)c.epoch,
                         (long long)c.step, (long long)l->spe);
    stop_threads(l);
    return start_threads(l, c, err, n);
}

int64_t loader_steps_per_epoch(const Loader *l) { return l->spe; }
const Dataset *loader_dataset(const Loader *l) { return &l->ds; }

void loader_norm(const Loader *l, float *mean, float *std) {
    for (int c = 0; c < l->C; c++) mean[c] = l->mean[c], std[c] = l->std[c];
}

void loader_close(Loader *l) {
    if (!l) return;
    stop_threads(l);
    for (int i = 0; i < l->nworkers; i++) {
        Worker *w = &l->workers[i];
        ZSTD_freeDCtx(w->dctx);
        resize_scratch_free(&w->rs);
        free(w->raw), free(w->img), free(w->tmp);
    }
    for (int i = 0; i < l->R; i++) {
        Batch *b = &l->slots[i].b;
        l->o.free(b->images);
        l->o.free(b->targets);
        free(b->labels);
        free(b->indices);
    }
    for (int i = 0; i < l->nperms; i++) free(l->perms[i].order);
    free(l->perms);
    free(l->slots);
    free(l->workers);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv_work);
    pthread_cond_destroy(&l->cv_ready);
    dataset_close(&l->ds);
    free(l);
}
