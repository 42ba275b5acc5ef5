#include "data_config.h"
#include "../kernels/error.h"
#include "device_config.h"
#include <math.h>
#include <stdlib.h>

// "0.485, 0.456,0.406" -> out; returns the count (at most 3), or exits naming key.
static int parse_floats(const char *key, const char *s, float *out) {
    int k = 0;
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        char *end;
        double v = strtod(p, &end);
        CG_CHECK(end != p && k < 3 && isfinite(v), "e.g. data_mean = 0.485,0.456,0.406",
                 "config key '%s' is '%s'; expected 1 or 3 comma-separated numbers", key, s);
        out[k++] = (float)v;
        p = end;
    }
    return k;
}

void loader_options_from_config(const Config *c, int train, int rank, int world,
                                LoaderOptions *o) {
    loader_options_default(o);
    o->dir = c->data_shards;
    o->split = train ? c->train_split : c->val_split;
    o->train = train;
    o->batch_size = c->batch_size;
    o->rank = rank, o->world = world;
    o->img_size = c->img_size;
    o->channels = c->in_chans;
    o->num_classes = c->num_classes;
    o->seed = (uint64_t)c->seed;
    o->threads = c->loader_threads;
    o->prefetch = c->loader_prefetch;
    o->rrc_scale_min = c->rrc_scale_min, o->rrc_scale_max = c->rrc_scale_max;
    o->rrc_ratio_min = c->rrc_ratio_min, o->rrc_ratio_max = c->rrc_ratio_max;
    o->hflip = c->hflip;
    o->randaug_n = c->randaug_n, o->randaug_m = c->randaug_m, o->randaug_mstd = c->randaug_mstd;
    o->randaug_inc = c->randaug_inc;
    o->reprob = c->reprob;
    o->mix = (MixConfig){c->mixup_alpha, c->cutmix_alpha, c->mixup_prob, c->mixup_switch_prob,
                         c->label_smoothing};
    o->eval_crop_pct = c->eval_crop_pct;
    o->interp = strcmp(c->interpolation, "bicubic") == 0 ? RESIZE_BICUBIC : RESIZE_BILINEAR;
    int nm = parse_floats("data_mean", c->data_mean, o->mean);
    int ns = parse_floats("data_std", c->data_std, o->std);
    CG_CHECK(nm == ns, "set both data_mean and data_std, with one value per channel",
             "data_mean has %d values and data_std %d", nm, ns);
    if (nm == 1)
        for (int k = 1; k < 3; k++) o->mean[k] = o->mean[0], o->std[k] = o->std[0];
    o->have_norm = nm > 0;
}

Loader *loader_open_from_config(const Config *c, int train, int batch, bool pinned) {
    return loader_open_from_config_rank(c, train, batch, pinned, 0, 1);
}

Loader *loader_open_from_config_rank(const Config *c, int train, int batch, bool pinned, int rank,
                                     int world) {
    CG_CHECK(batch % world == 0,
             train ? "make batch_size / accum_steps a multiple of the number of ranks"
                   : "make eval_batch_size (0: batch_size / accum_steps) a multiple of the number of ranks",
             "%s batches of %d images do not split across %d ranks (batch sizes are global: each "
             "rank reads batch / ranks images)", train ? "training" : "evaluation", batch, world);
    LoaderOptions o;
    loader_options_from_config(c, train, rank, world, &o);
    o.batch_size = batch;
    if (pinned) o.alloc = device_pinned_alloc, o.free = device_pinned_free;
    char err[2048];
    Loader *l = loader_open(&o, err, sizeof err);
    if (!l) {   // the loader's own hint (shards that do not fit the run), else how to build them
        const char *hint = strstr(err, "\n  hint: ") ? ""
            : strcmp(c->data_shards, "data/shards/fmnist") == 0
            ? "build the Fashion-MNIST shards first: make fmnist-shards"
            : "build shards with cgspn data build (data/README.md), or set data_shards";
        CG_FAIL(hint, "%s", err);
    }
    return l;
}

void data_check_classes(const Config *c, const Loader *train, const Loader *val, const char *who) {
    const Manifest *t = train ? &loader_dataset(train)->m : NULL;
    const Manifest *v = val ? &loader_dataset(val)->m : NULL;
    char diff[512];
    if (t && v)
        CG_CHECK(!class_lists_differ(t->class_names, t->num_classes, c->train_split, v->class_names,
                                     v->num_classes, c->val_split, diff, sizeof diff),
                 "rebuild the splits from the same class folders (cgspn data build refuses a val "
                 "split whose classes differ from train's)",
                 "%s: the %s and %s splits of %s name different classes: %s", who, c->train_split,
                 c->val_split, c->data_shards, diff);
    const Manifest *m = t ? t : v;
    if (!m || c->num_classes <= 0) return;
    CG_CHECK(c->num_classes == m->num_classes, "set num_classes to the shards' class count "
             "(--num_classes=N; cgspn data inspect DIR lists the classes)",
             "%s: num_classes = %d, but the %s split of %s has %d classes", who, c->num_classes,
             m->split, c->data_shards, m->num_classes);
}
