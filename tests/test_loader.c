// The threaded loader: the same batches for any thread count, ranks partitioning each epoch,
// resume from a saved cursor, mixup/cutmix targets, the eval path, and the augmentation
// pieces it is built from.
#include "testlib.h"
#include "../data/augment.h"
#include "../data/build.h"
#include "../data/loader.h"
#include "../data/resize.h"
#include "../data/shard_format.h"
#include <sys/stat.h>
#include <unistd.h>

#define N_IMAGES 48
#define STORED 20      // shorter side of the stored images
#define OUT 16         // loader output side
// Normalized values are (p/255 - mean)/std computed in float in two ways (fused multiply-add
// vs divide); they agree to a few float ulps of values of order 1.
#define NORM_TOL 1e-5f
// Soft-target rows are sums of K floats in [0, 1].
#define TARGET_SUM_TOL 1e-5

static char g_dir[256];
static uint8_t *g_pix[N_IMAGES];
static int g_h[N_IMAGES], g_w[N_IMAGES], g_label[N_IMAGES];
static char *g_names[] = {"zero", "one", "two", "three", "four"};

static int get_image(void *ctx, uint64_t i, int channels, int min_side, Image *im, int *label,
                     int *warning, char *err, size_t n) {
    size_t bytes = (size_t)g_h[i] * g_w[i] * 3;
    *im = (Image){malloc(bytes), g_h[i], g_w[i], 3};
    memcpy(im->pixels, g_pix[i], bytes);
    *label = g_label[i];
    *warning = 0;
    return 0;
}

static const char *image_name(void *ctx, uint64_t i) { return "test image"; }

// Smooth random images (so resizes and RandAugment have structure to act on), shorter side
// STORED, aspect up to 2.5, built into shards of a few images each.
static int setup_dataset(void **state) {
    snprintf(g_dir, sizeof g_dir, "/tmp/cgspn_test_loader_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    uint64_t seed = 42;
    for (int i = 0; i < N_IMAGES; i++) {
        int longer = STORED + (int)(test_rng_next(&seed) % (STORED * 3 / 2));
        int portrait = i % 3 == 0;
        g_h[i] = portrait ? longer : STORED, g_w[i] = portrait ? STORED : longer;
        g_label[i] = (int)(test_rng_next(&seed) % 5);
        g_pix[i] = malloc((size_t)g_h[i] * g_w[i] * 3);
        double fx = 0.1 + (test_rng_next(&seed) % 100) / 300.0, fy = 0.05 + (test_rng_next(&seed) % 100) / 400.0;
        for (int y = 0; y < g_h[i]; y++)
            for (int x = 0; x < g_w[i]; x++)
                for (int c = 0; c < 3; c++)
                    g_pix[i][((size_t)y * g_w[i] + x) * 3 + c] =
                        (uint8_t)(128 + 90 * sin(fx * x + c) * cos(fy * y - c) + (test_rng_next(&seed) % 21) - 10);
    }
    BuildSource src = {.count = N_IMAGES, .num_classes = 5, .class_names = g_names,
                       .get = get_image, .name = image_name};
    BuildOptions o = {.out_dir = g_dir, .split = "train", .size = STORED,
                      .layout = SHARD_LAYOUT_SHORTER, .channels = 3, .max_aspect = 3.0f,
                      .shard_bytes = 8000, .zstd_level = 3, .threads = 2};
    BuildStats st;
    char err[2048];
    if (build_shards(&src, &o, &st, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return st.shards > 2 ? 0 : -1;   // several shards, so reads cross shard boundaries
}

static int teardown_dataset(void **state) {
    for (int i = 0; i < N_IMAGES; i++) free(g_pix[i]);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd);
}

// Full timm-style training augmentation on the test set.
static LoaderOptions train_opts(int threads) {
    LoaderOptions o;
    loader_options_default(&o);
    o.dir = g_dir, o.split = "train", o.batch_size = 8, o.img_size = OUT, o.seed = 7;
    o.threads = threads;
    o.randaug_n = 2, o.randaug_m = 9, o.randaug_mstd = 0.5f;
    o.reprob = 0.5f;
    o.mix = (MixConfig){0.8f, 1.0f, 1.0f, 0.5f, 0.1f};
    return o;
}

static Loader *open_or_fail(const LoaderOptions *o) {
    char err[2048];
    Loader *l = loader_open(o, err, sizeof err);
    if (!l) fail_msg("%s", err);
    return l;
}

static const Batch *next_or_fail(Loader *l) {
    char err[2048];
    const Batch *b = loader_next(l, err, sizeof err);
    if (!b) fail_msg("%s", err);
    return b;
}

// A deep copy of a batch, to compare with later ones.
typedef struct Saved {
    float *images, *targets;
    int32_t labels[64];
    uint32_t indices[64];
    int count;
    int64_t epoch, step;
    float lam;
    size_t nimg, ntgt;
} Saved;

static Saved save(const Batch *b) {
    Saved s = {.count = b->count, .epoch = b->epoch, .step = b->step, .lam = b->lam};
    s.nimg = (size_t)b->count * b->channels * b->height * b->width;
    s.ntgt = (size_t)b->count * b->classes;
    s.images = malloc(s.nimg * sizeof(float) + 1);
    s.targets = malloc(s.ntgt * sizeof(float) + 1);
    memcpy(s.images, b->images, s.nimg * sizeof(float));
    memcpy(s.targets, b->targets, s.ntgt * sizeof(float));
    memcpy(s.labels, b->labels, sizeof(int32_t) * b->count);
    memcpy(s.indices, b->indices, sizeof(uint32_t) * b->count);
    return s;
}

static void assert_same_batch(const Saved *s, const Batch *b) {
    assert_int_equal(b->count, s->count);
    assert_int_equal(b->epoch, s->epoch);
    assert_int_equal(b->step, s->step);
    assert_memory_equal(b->indices, s->indices, sizeof(uint32_t) * s->count);
    assert_memory_equal(b->labels, s->labels, sizeof(int32_t) * s->count);
    assert_true(b->lam == s->lam);
    assert_memory_equal(b->images, s->images, s->nimg * sizeof(float));   // bit-exact
    assert_memory_equal(b->targets, s->targets, s->ntgt * sizeof(float));
}

static void unsave(Saved *s) { free(s->images), free(s->targets); }

// ---------------------------------------------------------------------------------------------

static void test_same_seed_gives_identical_batches_for_any_thread_count(void **state) {
    (void)state;
    LoaderOptions o1 = train_opts(1), o3 = train_opts(3);
    Loader *a = open_or_fail(&o1), *b = open_or_fail(&o3);
    int mixed = 0;
    for (int s = 0; s < 9; s++) {   // 6 steps per epoch: crosses into epoch 1
        Saved x = save(next_or_fail(a));
        const Batch *y = next_or_fail(b);
        assert_same_batch(&x, y);
        mixed += x.lam < 1;
        unsave(&x);
    }
    assert_true(mixed > 0);   // the comparison covered mixed batches
    loader_close(a);
    loader_close(b);
    // Another seed: another order.
    LoaderOptions o2 = train_opts(2);
    o2.seed = 8;
    Loader *c = open_or_fail(&o2), *d = open_or_fail(&o1);
    const Batch *bc = next_or_fail(c);
    Saved sd = save(next_or_fail(d));
    assert_true(memcmp(bc->indices, sd.indices, sizeof(uint32_t) * 8) != 0);
    unsave(&sd);
    loader_close(c);
    loader_close(d);
}

static void test_two_ranks_partition_each_epoch_exactly(void **state) {
    (void)state;
    for (int bs = 8; bs <= 10; bs += 2) {   // 48 / 8 uses every image; 48 / 10 drops 8
        LoaderOptions o0 = train_opts(2), o1 = train_opts(2);
        o0.batch_size = o1.batch_size = bs;
        o0.world = o1.world = 2;
        o1.rank = 1;
        Loader *r0 = open_or_fail(&o0), *r1 = open_or_fail(&o1);
        int64_t spe = loader_steps_per_epoch(r0);
        assert_int_equal(spe, N_IMAGES / bs);
        uint32_t order[N_IMAGES];
        for (int64_t epoch = 0; epoch < 2; epoch++) {
            loader_epoch_order(o0.seed, epoch, order, N_IMAGES);
            int seen[N_IMAGES] = {0};
            for (int64_t s = 0; s < spe; s++) {
                const Batch *b0 = next_or_fail(r0);
                Saved s0 = save(b0);
                const Batch *b1 = next_or_fail(r1);
                assert_int_equal(s0.count, bs / 2);
                assert_int_equal(b1->count, bs / 2);
                assert_int_equal(b1->epoch, epoch);
                for (int j = 0; j < bs / 2; j++) {
                    assert_int_equal(s0.indices[j], order[s * bs + j]);
                    assert_int_equal(b1->indices[j], order[s * bs + bs / 2 + j]);
                    seen[s0.indices[j]]++;
                    seen[b1->indices[j]]++;
                }
                unsave(&s0);
            }
            int total = 0;
            for (int i = 0; i < N_IMAGES; i++) {
                assert_true(seen[i] <= 1);   // disjoint
                total += seen[i];
            }
            assert_int_equal(total, spe * bs);   // every image of the used prefix, once
        }
        loader_close(r0);
        loader_close(r1);
    }
}

static void test_resume_from_saved_cursor_replays_identical_batches(void **state) {
    (void)state;
    LoaderOptions o = train_opts(2);
    Loader *a = open_or_fail(&o);
    Saved ref[10];
    LoaderCursor at4 = {0, 0};
    for (int s = 0; s < 10; s++) {
        if (s == 4) at4 = loader_cursor_get(a);
        ref[s] = save(next_or_fail(a));
    }
    assert_int_equal(at4.epoch, 0);
    assert_int_equal(at4.step, 4);
    LoaderCursor end = loader_cursor_get(a);
    assert_int_equal(end.epoch, 1);   // 10 batches at 6 per epoch
    assert_int_equal(end.step, 4);
    // A new loader (another thread count) set to the saved cursor continues identically.
    LoaderOptions o3 = train_opts(3);
    Loader *b = open_or_fail(&o3);
    char err[1024];
    assert_int_equal(loader_cursor_set(b, at4, err, sizeof err), 0);
    for (int s = 4; s < 10; s++) assert_same_batch(&ref[s], next_or_fail(b));
    // The same loader rewound mid-stream, too.
    assert_int_equal(loader_cursor_set(a, (LoaderCursor){0, 4}, err, sizeof err), 0);
    for (int s = 4; s < 7; s++) assert_same_batch(&ref[s], next_or_fail(a));
    // A cursor past the epoch is refused with a hint.
    assert_int_equal(loader_cursor_set(a, (LoaderCursor){0, 6}, err, sizeof err), -1);
    assert_non_null(strstr(err, "steps per epoch"));
    for (int s = 0; s < 10; s++) unsave(&ref[s]);
    loader_close(a);
    loader_close(b);
}

static void check_targets(const Batch *b, float smoothing) {
    int K = b->classes;
    float off = smoothing / K, on = 1 - smoothing + off;
    for (int i = 0; i < b->count; i++) {
        const float *t = b->targets + (size_t)i * K;
        double sum = 0;
        for (int k = 0; k < K; k++) sum += t[k];
        assert_float_equal(sum, 1.0, TARGET_SUM_TOL);
        float want[8];
        for (int k = 0; k < K; k++) want[k] = off;
        want[b->labels[i]] += b->lam * (on - off);
        want[b->labels[b->count - 1 - i]] += (1 - b->lam) * (on - off);
        for (int k = 0; k < K; k++) assert_float_equal(t[k], want[k], 1e-6);
    }
}

static void test_mixup_and_cutmix_targets_sum_to_one_and_match_lam(void **state) {
    (void)state;
    MixConfig cases[] = {
        {0.8f, 0, 1, 0.5f, 0.1f},   // mixup only
        {0, 1.0f, 1, 0.5f, 0.0f},   // cutmix only
        {0.8f, 1.0f, 1, 0.5f, 0.1f},
        {0.8f, 1.0f, 0, 0.5f, 0.1f},   // prob 0: never mixed
    };
    for (int c = 0; c < 4; c++) {
        LoaderOptions o = train_opts(2);
        o.mix = cases[c];
        Loader *l = open_or_fail(&o);
        int mixed = 0;
        for (int s = 0; s < 6; s++) {
            const Batch *b = next_or_fail(l);
            assert_true(b->lam >= 0 && b->lam <= 1);
            mixed += b->lam < 1;
            check_targets(b, cases[c].label_smoothing);
        }
        if (cases[c].prob == 0) assert_int_equal(mixed, 0);
        else assert_true(mixed >= 4);   // lam = 1 only when a cutmix box is empty
        loader_close(l);
    }
    // mix_batch on a known batch: mixup is the convex combination with the flipped batch.
    float img[4 * 2] = {1, 2, 3, 4, 5, 6, 7, 8}, orig[8];
    memcpy(orig, img, sizeof img);
    Rng r;
    rng_seed(&r, 3);
    MixConfig mc = {0.8f, 0, 1, 0.5f, 0};
    float lam = mix_batch(img, 4, 1, 1, 2, &mc, &r);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            assert_float_equal(img[i * 2 + j], lam * orig[i * 2 + j] + (1 - lam) * orig[(3 - i) * 2 + j], 1e-6);
}

static void test_eval_path_is_deterministic_in_order_and_exact_at_crop_pct_1(void **state) {
    (void)state;
    LoaderOptions o = train_opts(1);
    o.train = 0;
    o.batch_size = 10;
    o.img_size = STORED;
    o.eval_crop_pct = 1.0f;
    LoaderOptions o4 = o;
    o4.threads = 4;
    Loader *a = open_or_fail(&o), *b = open_or_fail(&o4);
    assert_int_equal(loader_steps_per_epoch(a), 5);   // ceil(48 / 10), the last one partial
    float mean[3], std[3];
    loader_norm(a, mean, std);
    int next = 0;
    for (int s = 0; s < 6; s++) {   // one pass and the first batch of the next
        Saved x = save(next_or_fail(a));
        assert_same_batch(&x, next_or_fail(b));
        assert_int_equal(x.count, s == 4 ? 8 : 10);
        assert_true(x.lam == 1);
        for (int j = 0; j < x.count; j++) {
            assert_int_equal(x.indices[j], next % N_IMAGES);
            next++;
            // Resize of the shorter side to 20 is the identity; the centre crop is exact.
            int i = (int)x.indices[j], h = g_h[i], w = g_w[i];
            int top = (int)nearbyint((h - STORED) / 2.0), left = (int)nearbyint((w - STORED) / 2.0);
            for (int c = 0; c < 3; c++)
                for (int y = 0; y < STORED; y++)
                    for (int xx = 0; xx < STORED; xx++) {
                        float p = g_pix[i][((size_t)(top + y) * w + left + xx) * 3 + c];
                        float want = (p / 255.0f - mean[c]) / std[c];
                        float got = x.images[(((size_t)j * 3 + c) * STORED + y) * STORED + xx];
                        assert_float_equal(got, want, NORM_TOL);
                    }
            assert_float_equal(x.targets[j * 5 + g_label[i]], 1.0f, 0);
        }
        unsave(&x);
    }
    loader_close(a);
    loader_close(b);
}

static void test_augmentation_depends_on_image_not_on_rank_or_batch_position(void **state) {
    (void)state;
    LoaderOptions one = train_opts(2), half = train_opts(1);
    one.mix.mixup_alpha = one.mix.cutmix_alpha = 0;   // per-image augmentation only
    half.mix = one.mix;
    half.world = 2, half.rank = 1;
    Loader *a = open_or_fail(&one), *b = open_or_fail(&half);
    size_t img = 3 * OUT * OUT;
    for (int s = 0; s < 3; s++) {
        Saved x = save(next_or_fail(a));
        const Batch *y = next_or_fail(b);
        for (int j = 0; j < 4; j++) {   // rank 1's images are positions 4..7 of the full batch
            assert_int_equal(y->indices[j], x.indices[4 + j]);
            assert_memory_equal(y->images + j * img, x.images + (4 + j) * img, img * sizeof(float));
        }
        unsave(&x);
    }
    loader_close(a);
    loader_close(b);
}

static void test_corrupt_record_stops_the_loader_naming_shard_and_record(void **state) {
    (void)state;
    char dir[300], cmd[1400];
    snprintf(dir, sizeof dir, "%s/damaged", g_dir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir '%s' && cp '%s'/train* '%s'/", dir, dir, g_dir, dir);
    assert_int_equal(system(cmd), 0);
    char path[600], err[2048];
    snprintf(path, sizeof path, "%s/train-00001.cgs", dir);
    Shard s;
    if (shard_open(&s, path, err, sizeof err)) fail_msg("%s", err);
    ShardRecord r = shard_record(&s, 1);
    shard_close(&s);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, (long)(r.offset + r.bytes / 2), SEEK_SET);
    int ch = fgetc(f);
    fseek(f, (long)(r.offset + r.bytes / 2), SEEK_SET);
    fputc(ch ^ 0x55, f);
    fclose(f);
    LoaderOptions o = train_opts(2);
    o.dir = dir;
    o.train = 0;   // reads every record in order
    Loader *l = open_or_fail(&o);
    const Batch *b = NULL;
    for (int k = 0; k < 5; k++)
        if (!(b = loader_next(l, err, sizeof err))) break;
    assert_null(b);
    assert_non_null(strstr(err, "train-00001.cgs"));
    assert_non_null(strstr(err, "record 1"));
    loader_close(l);
}

static void test_bad_loader_options_are_refused_with_the_reason(void **state) {
    (void)state;
    char err[2048];
    LoaderOptions o = train_opts(1);
    o.batch_size = 9, o.world = 2;
    assert_null(loader_open(&o, err, sizeof err));
    assert_non_null(strstr(err, "does not split evenly"));
    o = train_opts(1);
    o.channels = 1;
    assert_null(loader_open(&o, err, sizeof err));
    assert_non_null(strstr(err, "in_chans"));
    o = train_opts(1);
    o.batch_size = 64;
    assert_null(loader_open(&o, err, sizeof err));
    assert_non_null(strstr(err, "fewer than one batch"));
    o = train_opts(1);
    o.split = "nope";
    assert_null(loader_open(&o, err, sizeof err));
    assert_non_null(strstr(err, "nope.manifest"));
}

// ---------------------------------------------------------------------------------------------
// Pieces

static void test_rrc_boxes_stay_inside_the_image_with_ratio_in_range(void **state) {
    (void)state;
    Rng r;
    rng_seed(&r, 1);
    int sizes[][2] = {{20, 50}, {50, 20}, {7, 7}, {300, 400}};
    for (int k = 0; k < 4; k++)
        for (int t = 0; t < 500; t++) {
            int h = sizes[k][0], w = sizes[k][1];
            CropBox b = aug_rrc_box(&r, h, w, 0.08f, 1.0f, 0.75f, 4.0f / 3);
            assert_true(b.x0 >= 0 && b.y0 >= 0 && b.w >= 1 && b.h >= 1);
            assert_true(b.x0 + b.w <= w && b.y0 + b.h <= h);
        }
    CropBox e = aug_eval_box(100, 200, 224, 0.875f);   // shorter side -> 256, crop 224
    assert_float_equal(e.h, 100 * 224.0 / 256, 1e-4);
    assert_float_equal(e.x0 + e.w / 2, 100, 0.5);
}

static void test_flip_twice_is_identity_and_resize_keeps_constants(void **state) {
    (void)state;
    uint8_t img[5 * 7 * 3], orig[5 * 7 * 3], out[9 * 4 * 3];
    uint64_t seed = 3;
    for (int i = 0; i < 5 * 7 * 3; i++) orig[i] = img[i] = (uint8_t)test_rng_next(&seed);
    aug_hflip_u8(img, 5, 7, 3);
    assert_int_equal(img[0], orig[6 * 3]);
    aug_hflip_u8(img, 5, 7, 3);
    assert_memory_equal(img, orig, sizeof img);
    memset(img, 77, sizeof img);
    ResizeScratch rs = {0};
    for (int f = 0; f < 2; f++) {
        resize_crop_u8(img, 5, 7, 3, 0.5f, 1.25f, 5.5f, 3.0f, out, 9, 4, (ResizeFilter)f, &rs);
        for (size_t i = 0; i < sizeof out; i++) assert_int_equal(out[i], 77);
    }
    resize_scratch_free(&rs);
}

static void test_randaugment_ops_are_deterministic_and_known_ops_match_pil(void **state) {
    (void)state;
    enum { H = 9, W = 11 };
    uint8_t base[H * W * 3], a[H * W * 3], b[H * W * 3], tmp[H * W * 3];
    uint64_t seed = 5;
    for (int i = 0; i < H * W * 3; i++) base[i] = (uint8_t)(40 + test_rng_next(&seed) % 150);
    uint8_t fill[3] = {124, 116, 104};
    for (int c = 1; c <= 3; c += 2)
        for (int op = 0; op < RA_NUM_OPS; op++) {
            Rng r1, r2;
            rng_seed(&r1, (uint64_t)op), rng_seed(&r2, (uint64_t)op);
            memcpy(a, base, sizeof a), memcpy(b, base, sizeof b);
            randaug_apply((RandAugOp)op, a, H, W, c, 9, 1, fill, &r1, tmp);
            randaug_apply((RandAugOp)op, b, H, W, c, 9, 1, fill, &r2, tmp);
            assert_memory_equal(a, b, (size_t)H * W * c);
        }
    // Invert, AutoContrast (min -> 0, max -> 255, or 254 where PIL's int(i * scale + offset)
    // rounds 254.99999 down, as PIL does), Solarize at level 10 (threshold 0: all inverted).
    Rng r;
    rng_seed(&r, 1);
    memcpy(a, base, sizeof a);
    randaug_apply(RA_INVERT, a, H, W, 3, 0, 1, fill, &r, tmp);
    for (int i = 0; i < H * W * 3; i++) assert_int_equal(a[i], 255 - base[i]);
    memcpy(a, base, sizeof a);
    randaug_apply(RA_AUTOCONTRAST, a, H, W, 1, 0, 1, fill, &r, tmp);
    int lo = 255, hi = 0;
    for (int i = 0; i < H * W; i++) lo = a[i] < lo ? a[i] : lo, hi = a[i] > hi ? a[i] : hi;
    assert_int_equal(lo, 0);
    assert_true(hi >= 254);
    memcpy(a, base, sizeof a);
    randaug_apply(RA_SOLARIZE, a, H, W, 3, 10, 1, fill, &r, tmp);   // inc: threshold 256 - 256 = 0
    for (int i = 0; i < H * W * 3; i++) assert_int_equal(a[i], 255 - base[i]);
    // Translate by 45% of the width fills the uncovered columns with the fill colour.
    memcpy(a, base, sizeof a);
    rng_seed(&r, 2);
    randaug_apply(RA_TRANSLATE_X, a, H, W, 3, 10, 1, fill, &r, tmp);
    int filled = 0;
    for (int i = 0; i < H * W; i++) filled += !memcmp(a + 3 * i, fill, 3);
    assert_true(filled >= H * 4);   // int(0.45 * 11) = 4 columns at least
    // Whole pipeline, 1 and 3 channels, many draws: no crash, deterministic.
    for (int c = 1; c <= 3; c += 2)
        for (int t = 0; t < 50; t++) {
            Rng r1, r2;
            rng_seed(&r1, (uint64_t)t), rng_seed(&r2, (uint64_t)t);
            memcpy(a, base, sizeof a), memcpy(b, base, sizeof b);
            randaugment_u8(a, H, W, c, 3, 9, 0.5f, t & 1, fill, &r1, tmp);
            randaugment_u8(b, H, W, c, 3, 9, 0.5f, t & 1, fill, &r2, tmp);
            assert_memory_equal(a, b, (size_t)H * W * c);
        }
}

static void test_random_erasing_and_beta_samples_are_in_range(void **state) {
    (void)state;
    Rng r;
    rng_seed(&r, 9);
    float img[3 * 10 * 12];
    int erased_any = 0;
    for (int t = 0; t < 50; t++) {
        for (int i = 0; i < 360; i++) img[i] = 100;
        aug_random_erase(img, 3, 10, 12, 1.0f, &r);
        int changed = 0;
        for (int i = 0; i < 360; i++) changed += img[i] != 100;
        assert_true(changed <= 3 * 10 * 12 / 3 + 3 * 12);   // at most ~1/3 of the area
        erased_any += changed > 0;
    }
    assert_true(erased_any > 40);
    double mean = 0;
    for (int t = 0; t < 4000; t++) {
        double x = rng_beta(&r, 0.8, 0.8);
        assert_true(x >= 0 && x <= 1);
        mean += x / 4000;
    }
    assert_float_equal(mean, 0.5, 0.03);   // Beta(a, a) has mean 1/2; 4000 draws: std ~0.006
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_seed_gives_identical_batches_for_any_thread_count),
        cmocka_unit_test(test_two_ranks_partition_each_epoch_exactly),
        cmocka_unit_test(test_resume_from_saved_cursor_replays_identical_batches),
        cmocka_unit_test(test_mixup_and_cutmix_targets_sum_to_one_and_match_lam),
        cmocka_unit_test(test_eval_path_is_deterministic_in_order_and_exact_at_crop_pct_1),
        cmocka_unit_test(test_augmentation_depends_on_image_not_on_rank_or_batch_position),
        cmocka_unit_test(test_corrupt_record_stops_the_loader_naming_shard_and_record),
        cmocka_unit_test(test_bad_loader_options_are_refused_with_the_reason),
        cmocka_unit_test(test_rrc_boxes_stay_inside_the_image_with_ratio_in_range),
        cmocka_unit_test(test_flip_twice_is_identity_and_resize_keeps_constants),
        cmocka_unit_test(test_randaugment_ops_are_deterministic_and_known_ops_match_pil),
        cmocka_unit_test(test_random_erasing_and_beta_samples_are_in_range),
    };
    return cmocka_run_group_tests(tests, setup_dataset, teardown_dataset);
}
