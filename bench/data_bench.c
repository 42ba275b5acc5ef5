// `cgspn data bench` (loader throughput) and `cgspn data synth` (a synthetic ImageFolder).
#define _XOPEN_SOURCE 700   // nftw
#include "../train/data_cmd.h"
#include "../train/config.h"
#include "../train/data_config.h"
#include "../train/runlog.h"
#include "../data/build.h"
#include "../data/image.h"
#include "../data/loader.h"
#include "../data/shard_format.h"
#include "../kernels/error.h"
#include "../kernels/rng.h"
#include "../data/data_err.h"
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

// One synthetic image: a class-tinted gradient, a few discs and boxes, pixel noise.
static void synth_image(uint8_t *p, int h, int w, int label, int classes, Rng *r) {
    float base[3], grad[3][2];
    for (int c = 0; c < 3; c++) {
        base[c] = 60 + 140 * (float)((label * (c + 1) * 37) % classes) / classes;
        grad[c][0] = (rng_uniform(r) - 0.5f) * 120, grad[c][1] = (rng_uniform(r) - 0.5f) * 120;
    }
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++) {
                float v = base[c] + grad[c][0] * x / w + grad[c][1] * y / h;
                p[((size_t)y * w + x) * 3 + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
    int shapes = 3 + (int)rng_below(r, 5);
    for (int s = 0; s < shapes; s++) {
        int cx = (int)rng_below(r, (uint32_t)w), cy = (int)rng_below(r, (uint32_t)h);
        int rad = 4 + (int)rng_below(r, (uint32_t)(w / 4 + 1)), disc = rng_below(r, 2);
        uint8_t col[3] = {(uint8_t)rng_below(r, 256), (uint8_t)rng_below(r, 256), (uint8_t)rng_below(r, 256)};
        for (int y = cy - rad < 0 ? 0 : cy - rad; y < h && y <= cy + rad; y++)
            for (int x = cx - rad < 0 ? 0 : cx - rad; x < w && x <= cx + rad; x++)
                if (!disc || (x - cx) * (x - cx) + (y - cy) * (y - cy) <= rad * rad)
                    memcpy(p + ((size_t)y * w + x) * 3, col, 3);
    }
    for (size_t i = 0; i < (size_t)h * w * 3; i++) {
        int v = p[i] + (int)rng_below(r, 17) - 8;
        p[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
}

int data_synth_folder(const char *root, int count, int classes, int height, int width, int png,
                      uint64_t seed, char *err, size_t n) {
    char path[4400];
    snprintf(path, sizeof path, "%s", root);
    for (char *p = path + 1; *p; p++)   // parents first (mkdir -p)
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0755);
            *p = '/';
        }
    if (mkdir(root, 0755) != 0 && errno != EEXIST)
        return data_fail(err, n, "%s: cannot create: %s", root, strerror(errno));
    for (int k = 0; k < classes; k++) {
        snprintf(path, sizeof path, "%s/class_%03d", root, k);
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return data_fail(err, n, "%s: cannot create: %s", path, strerror(errno));
    }
    int failed = 0;
    #pragma omp parallel for schedule(dynamic, 4)
    for (int i = 0; i < count; i++) {
        if (failed) continue;
        Rng r;
        rng_seed_stream(&r, seed, 0x5e17, (uint64_t)i);
        int h = height * 3 / 4 + (int)rng_below(&r, (uint32_t)(height / 2 + 1));
        int w = width * 3 / 4 + (int)rng_below(&r, (uint32_t)(width / 2 + 1));
        int label = i % classes;
        uint8_t *p = cg_malloc((size_t)h * w * 3);
        synth_image(p, h, w, label, classes, &r);
        char file[4200], e[512];
        snprintf(file, sizeof file, "%s/class_%03d/%06d.%s", root, label, i, png ? "png" : "jpg");
        int rc;
        if (png) {
            rc = image_write_png(file, p, h, w, 3, e, sizeof e);
        } else {
            uint8_t *jpg;
            size_t size;
            rc = image_encode_jpeg(p, h, w, 3, 90, &jpg, &size, e, sizeof e);
            if (!rc) {
                FILE *f = fopen(file, "wb");
                rc = !f || fwrite(jpg, 1, size, f) != size;
                if (f && fclose(f)) rc = 1;
                if (rc) data_fail(e, sizeof e, "%s: write failed: %s", file, strerror(errno));
                image_free_jpeg(jpg);
            }
        }
        free(p);
        if (rc) {
            #pragma omp critical
            if (!failed) data_fail(err, n, "%s", e), failed = 1;
        }
    }
    return failed ? -1 : 0;
}

int data_synth_main(int argc, char **argv) {
    const char *out = NULL;
    int count = 1000, classes = 10, height = 288, width = 352, png = 0;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--count") && i + 1 < argc) count = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--classes") && i + 1 < argc) classes = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--height") && i + 1 < argc) height = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--width") && i + 1 < argc) width = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--png")) png = 1;
        else if (argv[i][0] != '-' && !out) out = argv[i];
        else CG_FAIL("see cgspn data --help", "data synth: unexpected argument '%s'", argv[i]);
    }
    CG_CHECK(out, "cgspn data synth OUT [--count N]", "data synth needs the output folder");
    CG_CHECK(count >= 1 && classes >= 1 && height >= 8 && width >= 8 && height <= 8192 &&
             width <= 8192, "see cgspn data --help", "data synth: bad --count/--classes/--height/--width");
    char err[1024];
    double t0 = now_seconds();
    if (data_synth_folder(out, count, classes, height, width, png, seed, err, sizeof err))
        CG_FAIL("", "%s", err);
    printf("data synth: %d %s images (%d classes, about %d x %d) in %s, %.1f s\n", count,
           png ? "PNG" : "JPEG", classes, height, width, out, now_seconds() - t0);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// bench

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *f) {
    (void)st, (void)flag, (void)f;
    return remove(path);
}

// Removes argv[i] (and its value when it takes one) when it is one of bench's own flags.
static int take_flag(int *argc, char **argv, const char *name, const char **value) {
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], name) != 0) continue;
        CG_CHECK(i + 1 < *argc, "see cgspn data --help", "%s needs a value", name);
        *value = argv[i + 1];
        memmove(argv + i, argv + i + 2, sizeof(char *) * (size_t)(*argc - i - 2));
        *argc -= 2;
        return 1;
    }
    return 0;
}

#define BENCH_MIN_SECONDS 3.0   // each measurement runs at least this long

static double cpu_seconds(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Images per second of `steps` batches after `warm` warm-up batches, and the CPU time spent
// per image (all threads; a measure that holds when other work shares the machine).
static double measure(LoaderOptions *o, int threads, int steps, int warm, double *cpu_ms) {
    o->threads = threads;
    char err[2048];
    Loader *l = loader_open(o, err, sizeof err);
    if (!l) CG_FAIL("", "%s", err);
    long images = 0;
    double t0 = now_seconds() + 1e9, c0 = 0;   // (the time test starts after warm-up)
    for (int s = 0; s < warm + steps || now_seconds() - t0 < BENCH_MIN_SECONDS; s++) {
        if (s == warm) t0 = now_seconds(), c0 = cpu_seconds();
        const Batch *b = loader_next(l, err, sizeof err);
        if (!b) CG_FAIL("", "%s", err);
        if (s >= warm) images += b->count;
    }
    double rate = images / (now_seconds() - t0);
    *cpu_ms = 1e3 * (cpu_seconds() - c0) / images;   // includes the prefetch of up to R batches
    loader_close(l);
    return rate;
}

int data_bench_main(int argc, char **argv) {
    const char *v;
    int steps = 0, count = 2048;
    char list[256] = "";
    if (take_flag(&argc, argv, "--steps", &v)) steps = atoi(v);
    if (take_flag(&argc, argv, "--count", &v)) count = atoi(v);
    if (take_flag(&argc, argv, "--threads-list", &v)) snprintf(list, sizeof list, "%s", v);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: cgspn data bench [CONFIG] [--key=value ...] [--steps N] "
                   "[--threads-list 1,2,4] [--count N]\n"
                   "Loader throughput with the config's augmentation. Without data_shards, on "
                   "--count synthetic JPEGs\n(about 288 x 352) built into 256 px shards in a "
                   "temporary folder. Defaults: img_size 224, batch 256,\nRandAugment n2 m9 "
                   "mstd0.5, reprob 0.25, mixup 0.8, cutmix 1.0 (the DeiT/timm ImageNet recipe).\n");
            return 0;
        }
    Config c;
    config_defaults(&c);
    c.img_size = 224, c.in_chans = 3, c.batch_size = 256;
    c.randaug_n = 2, c.reprob = 0.25f, c.mixup_alpha = 0.8f, c.cutmix_alpha = 1.0f;
    c.data_shards[0] = '\0';   // synthetic unless a config or --data_shards names shards
    int rest = config_parse_args(&c, argc, argv, 1);
    CG_CHECK(rest == 0, "see cgspn data bench --help", "unexpected argument '%s'", argv[1]);
    CG_CHECK(count >= 1, "--count N", "--count must be >= 1");
    int cores = omp_get_max_threads();
    char tmp[] = "/tmp/cgspn_bench_XXXXXX", err[4096];
    int synthetic = !c.data_shards[0];
    if (synthetic) {
        CG_CHECK(mkdtemp(tmp), "", "mkdtemp %s: %s", tmp, strerror(errno));
        char jpeg[4200], shards[4200];
        snprintf(jpeg, sizeof jpeg, "%s/jpeg", tmp);
        snprintf(shards, sizeof shards, "%s/shards", tmp);
        printf("bench: %d synthetic JPEGs (about 288 x 352, q90) in %s\n", count, jpeg);
        if (data_synth_folder(jpeg, count, 10, 288, 352, 0, 1, err, sizeof err)) CG_FAIL("", "%s", err);
        BuildSource src;
        if (build_source_imagefolder(&src, jpeg, false, err, sizeof err)) CG_FAIL("", "%s", err);
        BuildOptions bo = {.out_dir = shards, .split = "train", .size = 256,
                           .layout = SHARD_LAYOUT_SHORTER, .channels = 3,
                           .max_aspect = BUILD_DEFAULT_MAX_ASPECT,
                           .shard_bytes = BUILD_DEFAULT_SHARD_BYTES,
                           .zstd_level = BUILD_DEFAULT_ZSTD_LEVEL};
        BuildStats st;
        if (build_shards(&src, &bo, &st, err, sizeof err)) CG_FAIL("", "%s", err);
        build_source_free(&src);
        printf("bench: build (JPEG decode, resize to shorter side 256, zstd): %.0f img/s on %d "
               "threads, %.0f bytes per image\n", st.images / st.seconds, cores,
               (double)st.bytes / st.images);
        CG_CHECK(strlen(shards) < sizeof c.data_shards, "", "temporary path too long");
        memcpy(c.data_shards, shards, strlen(shards) + 1);
        c.num_classes = 10;
    }
    LoaderOptions o;
    loader_options_from_config(&c, 1, 0, 1, &o);
    o.num_classes = 0;   // the dataset's
    o.channels = 0;
    char dsplit[64];
    snprintf(dsplit, sizeof dsplit, "%s", o.split);
    {   // the batch must fit the split
        Dataset d;
        if (dataset_open(&d, o.dir, o.split, err, sizeof err)) CG_FAIL("", "%s", err);
        if ((uint64_t)o.batch_size > d.m.images) o.batch_size = (int)d.m.images;
        printf("bench: %s/%s: %llu images, stored %s %d px; output %d px, batch %d\n", o.dir,
               dsplit, (unsigned long long)d.m.images,
               d.m.layout == SHARD_LAYOUT_SQUARE ? "square" : "shorter side", d.m.image_size,
               o.img_size, o.batch_size);
        dataset_close(&d);
    }
    if (steps <= 0) steps = 2048 / o.batch_size > 4 ? 2048 / o.batch_size : 4;
    int threads[64], nt = 0;
    if (list[0]) {
        for (char *p = strtok(list, ", "); p && nt < 64; p = strtok(NULL, ", ")) threads[nt++] = atoi(p);
    } else {
        for (int t = 1; t < cores && nt < 63; t *= 2) threads[nt++] = t;
        threads[nt++] = cores;
    }
    printf("bench: train path: random-resized-crop (scale %g..%g), hflip %g, RandAugment n%d m%g "
           "mstd%g, reprob %g, mixup %g / cutmix %g; %d batches per measurement\n",
           o.rrc_scale_min, o.rrc_scale_max, o.hflip, o.randaug_n, o.randaug_m, o.randaug_mstd,
           o.reprob, o.mix.mixup_alpha, o.mix.cutmix_alpha, steps);
    for (int i = 0; i < nt; i++) {
        CG_CHECK(threads[i] >= 1, "--threads-list 1,2,4", "thread counts must be >= 1");
        double cpu;
        double rate = measure(&o, threads[i], steps, 2, &cpu);
        printf("bench data train %3d threads: %8.0f img/s  (%6.0f img/s per thread; %.3f ms CPU "
               "per image)\n", threads[i], rate, rate / threads[i], cpu);
    }
    LoaderOptions e = o;
    e.train = 0;
    double cpu;
    double rate = measure(&e, threads[nt - 1], steps, 2, &cpu);
    printf("bench data eval  %3d threads: %8.0f img/s  (%6.0f img/s per thread; %.3f ms CPU per "
           "image; resize + centre crop %g)\n", threads[nt - 1], rate, rate / threads[nt - 1], cpu,
           e.eval_crop_pct);
    if (synthetic) nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

int data_bench_run(FILE *out) {
    (void)out;   // prints to stdout, like the other benches' tables
    char name[] = "bench";
    char *argv[] = {name, NULL};
    return data_bench_main(1, argv);
}
