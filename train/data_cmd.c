// `cgspn data`: the dispatcher, `data build` and `data verify`.
#include "data_cmd.h"
#include "../data/build.h"
#include "../data/dataset.h"
#include "../data/shard_format.h"
#include "../kernels/error.h"
#include <dirent.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

static void data_usage(FILE *f) {
    fprintf(f,
        "usage: cgspn data SUBCOMMAND ...\n\n"
        "  build   --from imagefolder ROOT --out DIR --size S [--val | --split NAME]\n"
        "          [--labels FILE: ROOT is a flat folder, FILE names each image's class,\n"
        "          'NAME WNID' or NAME,WNID lines or Kaggle's LOC_val_solution.csv]\n"
        "          [--layout shorter|square] [--channels 1|3] [--max-aspect A] [--shard-mb MB]\n"
        "          [--zstd-level L] [--threads N] [--strict] [--quiet] [--skip-empty-classes]\n"
        "          a class folder without images is refused (it would shift the labels after\n"
        "          it) unless --skip-empty-classes; a val split takes the class list of the\n"
        "          train split already in DIR (a class train lacks is refused), a train split\n"
        "          must have that of the val split already there\n"
        "  build   --from idx IDXDIR --out DIR [--size S] [--split train|val]\n"
        "          IDX (MNIST-style) train-* -> split train, t10k-* -> split val (both by default)\n"
        "  inspect DIR [--split NAME] [--sheet FILE.png] [--per-class K]\n"
        "          counts per class, stored sizes, bytes, mean/std; a PNG contact sheet\n"
        "  verify  DIR [--split NAME] [--threads N]\n"
        "          checks every header, index and record checksum; exit status 1 on damage\n"
        "  bench   [CONFIG] [--key=value ...] [--steps N] [--threads-list 1,2,4] [--count N]\n"
        "          loader throughput (img/s) with the config's augmentation; without\n"
        "          data_shards, on a synthetic 224 px JPEG set built in a temporary folder\n"
        "  synth   OUT [--count N] [--classes K] [--height H] [--width W] [--png] [--seed S]\n"
        "          a synthetic ImageFolder tree (for benchmarks)\n\n"
        "Example: cgspn data build --from idx /usr/share/datasets/fashion-mnist --out data/shards/fmnist\n"
        "Shard format and loader: data/README.md.\n");
}

int cmd_data(int argc, char **argv) {
    if (argc < 3 || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
        data_usage(argc < 3 ? stderr : stdout);
        return argc < 3 ? 1 : 0;
    }
    static const struct { const char *name; int (*run)(int, char **); } kSub[] = {
        {"build", data_build_main}, {"inspect", data_inspect_main}, {"verify", data_verify_main},
        {"bench", data_bench_main}, {"synth", data_synth_main},
    };
    for (size_t i = 0; i < sizeof kSub / sizeof kSub[0]; i++)
        if (!strcmp(argv[2], kSub[i].name)) return kSub[i].run(argc - 2, argv + 2);
    data_usage(stderr);
    CG_FAIL("see the list above", "unknown data subcommand '%s'", argv[2]);
}

// "--name VALUE" at argv[*i]: returns VALUE and advances *i, or exits naming the flag.
static const char *flag_value(int argc, char **argv, int *i) {
    CG_CHECK(*i + 1 < argc, "see cgspn data --help", "%s needs a value", argv[*i]);
    return argv[++*i];
}

static long flag_long(int argc, char **argv, int *i, long lo, long hi) {
    const char *name = argv[*i], *v = flag_value(argc, argv, i);
    char *end;
    long x = strtol(v, &end, 10);
    CG_CHECK(end != v && !*end && x >= lo && x <= hi, "see cgspn data --help",
             "%s is '%s'; expected an integer in %ld..%ld", name, v, lo, hi);
    return x;
}

// The other of train / val already built in out: labels are indices into the class list, so
// the two must share it. A val split takes train's list (it may hold some of its classes: a class
// train lacks is refused); a train split must have val's list exactly.
static void match_other_split_classes(const char *out, const char *split, BuildSource *src) {
    const char *other = !strcmp(split, "val") ? "train" : !strcmp(split, "train") ? "val" : NULL;
    char path[1200], err[2048], diff[512], whose[1300];
    if (!other) return;
    manifest_path(out, other, path, sizeof path);
    if (access(path, F_OK) != 0) return;
    Manifest m;
    if (manifest_read(&m, path, err, sizeof err) != 0) CG_FAIL("", "%s", err);
    snprintf(whose, sizeof whose, "the %s split in %s", other, out);
    const char *hint = "build both splits from the same class folders (an empty or extra folder in "
                       "one shifts every label after it; see --skip-empty-classes)";
    if (!strcmp(split, "val")) {
        if (build_source_use_classes(src, m.class_names, m.num_classes, whose, err, sizeof err))
            CG_FAIL(hint, "data build: the val split: %s", err);
    } else {
        bool differ = class_lists_differ(src->class_names, src->num_classes, split, m.class_names,
                                         m.num_classes, other, diff, sizeof diff);
        CG_CHECK(!differ, hint, "data build: the %s split's classes differ from %s: %s", split,
                 whose, diff);
    }
    manifest_free(&m);
}

int data_build_main(int argc, char **argv) {
    const char *from = NULL, *src_path = NULL, *out = NULL, *split = NULL, *layout = NULL;
    const char *labels = NULL;   // a flat folder's label file (ImageNet val)
    bool skip_empty = false;
    BuildOptions o = {.channels = 0, .max_aspect = BUILD_DEFAULT_MAX_ASPECT,
                      .shard_bytes = BUILD_DEFAULT_SHARD_BYTES,
                      .zstd_level = BUILD_DEFAULT_ZSTD_LEVEL, .progress = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--from")) {
            from = flag_value(argc, argv, &i);
            CG_CHECK(i + 1 < argc && argv[i + 1][0] != '-', "e.g. --from imagefolder /data/imagenet/train",
                     "--from %s needs the source path after it", from);
            src_path = argv[++i];
        } else if (!strcmp(a, "--out")) out = flag_value(argc, argv, &i);
        else if (!strcmp(a, "--size")) o.size = (int)flag_long(argc, argv, &i, 1, SHARD_MAX_SIDE);
        else if (!strcmp(a, "--val")) split = "val";
        else if (!strcmp(a, "--split")) split = flag_value(argc, argv, &i);
        else if (!strcmp(a, "--layout")) layout = flag_value(argc, argv, &i);
        else if (!strcmp(a, "--labels")) labels = flag_value(argc, argv, &i);
        else if (!strcmp(a, "--channels")) o.channels = (int)flag_long(argc, argv, &i, 1, 3);
        else if (!strcmp(a, "--max-aspect")) {
            const char *v = flag_value(argc, argv, &i);
            o.max_aspect = strtof(v, NULL);
            CG_CHECK(o.max_aspect >= 1, "e.g. --max-aspect 3", "--max-aspect is '%s'; expected >= 1", v);
        } else if (!strcmp(a, "--shard-mb"))
            o.shard_bytes = (uint64_t)flag_long(argc, argv, &i, 1, 1L << 20) << 20;
        else if (!strcmp(a, "--zstd-level")) o.zstd_level = (int)flag_long(argc, argv, &i, -7, 22);
        else if (!strcmp(a, "--threads")) o.threads = (int)flag_long(argc, argv, &i, 0, 4096);
        else if (!strcmp(a, "--strict")) o.strict = 1;
        else if (!strcmp(a, "--quiet")) o.progress = 0;
        else if (!strcmp(a, "--skip-empty-classes")) skip_empty = true;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) { data_usage(stdout); return 0; }
        else CG_FAIL("see cgspn data --help", "data build: unknown argument '%s'", a);
    }
    CG_CHECK(from && out, "e.g. cgspn data build --from idx /usr/share/datasets/fashion-mnist "
             "--out data/shards/fmnist", "data build needs --from KIND PATH and --out DIR");
    CG_CHECK(o.channels != 2, "--channels 1 or 3", "--channels 2 is not supported");
    int idx = !strcmp(from, "idx");
    CG_CHECK(idx || !strcmp(from, "imagefolder"), "--from imagefolder ROOT or --from idx DIR",
             "unknown source kind '%s'", from);
    CG_CHECK(!labels || !idx, "--labels goes with --from imagefolder DIR (a flat folder)",
             "--labels with --from idx: IDX files carry their labels");
    o.out_dir = out;
    o.layout = idx ? SHARD_LAYOUT_SQUARE : SHARD_LAYOUT_SHORTER;
    if (layout) {
        CG_CHECK(!strcmp(layout, "square") || !strcmp(layout, "shorter"), "--layout shorter|square",
                 "unknown layout '%s'", layout);
        o.layout = !strcmp(layout, "square") ? SHARD_LAYOUT_SQUARE : SHARD_LAYOUT_SHORTER;
    }
    if (!o.channels) o.channels = idx ? 1 : 3;
    CG_CHECK(idx || o.size > 0, "e.g. --size 256 (ImageNet: shorter side 256 for 224 crops)",
             "data build --from imagefolder needs --size S");

    const char *splits[2] = {split ? split : "train", "val"};
    int nsplits = idx && !split ? 2 : 1;
    char err[4096];
    for (int k = 0; k < nsplits; k++) {
        BuildSource src;
        int rc = idx      ? build_source_idx(&src, src_path, splits[k], err, sizeof err)
               : labels ? build_source_labeled_folder(&src, src_path, labels, err, sizeof err)
                        : build_source_imagefolder(&src, src_path, skip_empty, err, sizeof err);
        if (rc) CG_FAIL("", "%s", err);
        BuildOptions ok = o;
        ok.split = splits[k];
        if (src.note[0]) printf("data build: %s split: %s\n", ok.split, src.note);
        match_other_split_classes(out, ok.split, &src);
        if (!ok.size) ok.size = src.native_size;
        CG_CHECK(ok.size > 0, "pass --size S", "the source's images differ in size");
        printf("data build: %s split from %s (%llu images, %d classes) -> %s/%s-*%s, %s %d px, "
               "%d channel%s\n", ok.split, src_path, (unsigned long long)src.count,
               src.num_classes, out, ok.split, SHARD_EXT,
               ok.layout == SHARD_LAYOUT_SQUARE ? "square" : "shorter side", ok.size,
               ok.channels, ok.channels > 1 ? "s" : "");
        BuildStats st;
        rc = build_shards(&src, &ok, &st, err, sizeof err);
        build_source_free(&src);
        if (rc) CG_FAIL("", "data build failed: %s", err);
        printf("data build: %s: %llu images in %d shard%s, %.1f MiB, %.1f s (%.0f img/s); "
               "%llu unreadable skipped, %llu with decoder warnings, %llu other files ignored\n",
               ok.split, (unsigned long long)st.images, st.shards, st.shards == 1 ? "" : "s",
               st.bytes / 1048576.0, st.seconds, st.images / (st.seconds > 0 ? st.seconds : 1),
               (unsigned long long)st.skipped, (unsigned long long)st.warnings,
               (unsigned long long)st.ignored);
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// verify

#define VERIFY_REPORT_MAX 20   // damaged records printed per shard; the rest counted

// Every record of one open shard; returns the number of bad records.
static uint64_t verify_records(const Shard *s, int threads) {
    uint64_t bad = 0;
    int reported = 0;
    #pragma omp parallel num_threads(threads) reduction(+ : bad)
    {
        ZSTD_DCtx *dctx = ZSTD_createDCtx();
        uint8_t *buf = NULL;
        size_t cap = 0;
        char err[1024];
        #pragma omp for schedule(dynamic, 64)
        for (uint64_t i = 0; i < s->num_records; i++) {
            ShardRecord r = shard_record(s, i);
            size_t need = (size_t)r.height * r.width * s->channels;
            if (need > cap) {
                free(buf);
                buf = cg_malloc(need);
                cap = need;
            }
            if (shard_verify_record(s, i, dctx, buf, cap, err, sizeof err)) {
                bad++;
                #pragma omp critical
                if (reported++ < VERIFY_REPORT_MAX) fprintf(stderr, "cgspn: %s\n", err);
            }
        }
        free(buf);
        ZSTD_freeDCtx(dctx);
    }
    return bad;
}

static int verify_split(const char *dir, const char *split, int threads, uint64_t *images) {
    char path[4096], err[4096];
    manifest_path(dir, split, path, sizeof path);
    Manifest m;
    if (manifest_read(&m, path, err, sizeof err)) {
        fprintf(stderr, "cgspn: %s\n", err);
        return 1;
    }
    int failures = 0;
    uint64_t total = 0;
    for (int k = 0; k < m.num_shards; k++) {
        char sp[8192];
        snprintf(sp, sizeof sp, "%s/%s", dir, m.shard_files[k]);
        Shard s;
        if (shard_open(&s, sp, err, sizeof err)) {
            fprintf(stderr, "cgspn: %s\n", err);
            failures++;
            continue;
        }
        const char *mismatch = s.num_records != m.shard_images[k] ? "image count"
                               : s.channels != m.channels ? "channels"
                               : s.image_size != m.image_size ? "size"
                               : s.num_classes != m.num_classes ? "class count" : NULL;
        if (mismatch) {
            fprintf(stderr, "cgspn: %s: %s differs from %s\n", sp, mismatch, path);
            failures++;
        }
        uint64_t bad = verify_records(&s, threads);
        printf("  %-24s %9llu records  %9.1f MiB  %s\n", m.shard_files[k],
               (unsigned long long)s.num_records, s.size / 1048576.0,
               bad ? "DAMAGED" : mismatch ? "MISMATCH" : "ok");
        if (bad) {
            fprintf(stderr, "cgspn: %s: %llu of %llu records damaged\n", sp,
                    (unsigned long long)bad, (unsigned long long)s.num_records);
            failures++;
        }
        total += s.num_records;
        shard_close(&s);
    }
    *images += total;
    manifest_free(&m);
    return failures;
}

int data_verify_main(int argc, char **argv) {
    const char *dir = NULL, *split = NULL;
    int threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--split")) split = flag_value(argc, argv, &i);
        else if (!strcmp(argv[i], "--threads")) threads = (int)flag_long(argc, argv, &i, 0, 4096);
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { data_usage(stdout); return 0; }
        else if (argv[i][0] != '-' && !dir) dir = argv[i];
        else CG_FAIL("see cgspn data --help", "data verify: unexpected argument '%s'", argv[i]);
    }
    CG_CHECK(dir, "cgspn data verify DIR", "data verify needs the shard folder");
    if (threads <= 0) threads = omp_get_max_threads();
    char names[256][64];
    int ns = split ? 1 : dataset_list_splits(dir, names, 256);
    if (split) snprintf(names[0], sizeof names[0], "%s", split);
    CG_CHECK(ns > 0, "build shards with cgspn data build (a build that did not finish writes no "
             "manifest)", "%s: no *%s files", dir, MANIFEST_EXT);
    int failures = 0;
    uint64_t images = 0;
    for (int k = 0; k < ns; k++) {
        printf("verify %s/%s:\n", dir, names[k]);
        failures += verify_split(dir, names[k], threads, &images);
    }
    // Leftovers of interrupted builds are harmless (never read) but worth knowing about.
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len > 4 && !strcmp(e->d_name + len - 4, ".tmp"))
            printf("  note: %s/%s is left from an interrupted build; it is never read and can be "
                   "deleted\n", dir, e->d_name);
    }
    if (d) closedir(d);
    if (failures) {
        fprintf(stderr, "cgspn: verify %s: %d problem%s found\n  hint: rebuild the damaged split "
                "with cgspn data build\n", dir, failures, failures == 1 ? "" : "s");
        return 1;
    }
    printf("verify %s: ok (%llu images, every checksum matches)\n", dir, (unsigned long long)images);
    return 0;
}
