// Shards and image decoding: exact round trips (writer, builder, IDX, ImageFolder), PNG and
// JPEG decoding against known pixels, and every kind of bad input giving a clear error that
// names the file (and record) with no crash and no partial output that looks complete.
#include "testlib.h"
#include "../data/build.h"
#include "../data/dataset.h"
#include "../data/idx.h"
#include "../data/image.h"
#include "../data/shard.h"
#include "../data/shard_format.h"
#include "../data/shard_writer.h"
#include <dirent.h>
#include <png.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"
// JPEG at quality 100 with 4:4:4 chroma and the accurate integer DCT: the only loss is the
// rounding of DCT coefficients to quantization step 1 and of YCbCr <-> RGB to 8 bits. On the
// smooth test image that measures max 4 levels (RGB; 1 for gray) and mean 0.46 (0.07); 6 and
// 1.0 leave room for other libjpeg-turbo builds (SIMD paths) without hiding a real error
// (a wrong colour conversion or chroma upsampling is tens of levels off).
#define JPEG_Q100_MAX_ERR 6
#define JPEG_Q100_MEAN_ERR 1.0

static char g_dir[256];

static int setup_dir(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/cgspn_test_shards_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown_dir(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd);
}

static const char *tmp_path(const char *name) {
    static char paths[8][512];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 512, "%s/%s", g_dir, name);
    return p;
}

static uint8_t *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*size ? *size : 1);
    assert_int_equal(fread(b, 1, *size, f), *size);
    fclose(f);
    return b;
}

static void write_all(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (size) assert_int_equal(fwrite(data, 1, size, f), size);
    assert_int_equal(fclose(f), 0);
}

static int count_files(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int k = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t a = strlen(e->d_name), b = strlen(suffix);
        k += a >= b && strcmp(e->d_name + a - b, suffix) == 0;
    }
    closedir(d);
    return k;
}

// ---------------------------------------------------------------------------------------------
// An in-memory build source: n images of varying shape, shorter side S, random pixels.

typedef struct MemSet {
    int n, c;
    int *h, *w, *label;
    uint8_t **pix;
    int bad;            // item index whose get fails (-1: none)
} MemSet;

static int mem_get(void *ctx, uint64_t i, int channels, int min_side, Image *im, int *label,
                   int *warning, char *err, size_t n) {
    MemSet *m = ctx;
    *warning = 0;
    if ((int)i == m->bad) return snprintf(err, n, "mem item %d: unreadable", (int)i), -1;
    assert_int_equal(channels, m->c);
    size_t bytes = (size_t)m->h[i] * m->w[i] * m->c;
    *im = (Image){malloc(bytes), m->h[i], m->w[i], m->c};
    memcpy(im->pixels, m->pix[i], bytes);
    *label = m->label[i];
    return 0;
}

static const char *mem_name(void *ctx, uint64_t i) { return "mem item"; }

static char *g_names[] = {"cat", "dog", "bird with space", "T-shirt/top"};

static MemSet mem_make(int n, int c, int S, uint64_t seed) {
    MemSet m = {n, c, calloc(n, sizeof(int)), calloc(n, sizeof(int)), calloc(n, sizeof(int)),
                calloc(n, sizeof(uint8_t *)), -1};
    for (int i = 0; i < n; i++) {
        int longer = S + (int)(test_rng_next(&seed) % (2 * S));   // aspect <= 3 (max_aspect)
        int portrait = test_rng_next(&seed) & 1;
        m.h[i] = portrait ? longer : S, m.w[i] = portrait ? S : longer;
        m.label[i] = (int)(test_rng_next(&seed) % 4);
        size_t bytes = (size_t)m.h[i] * m.w[i] * c;
        m.pix[i] = malloc(bytes);
        for (size_t k = 0; k < bytes; k++) m.pix[i][k] = (uint8_t)test_rng_next(&seed);
    }
    return m;
}

static void mem_free(MemSet *m) {
    for (int i = 0; i < m->n; i++) free(m->pix[i]);
    free(m->pix), free(m->h), free(m->w), free(m->label);
}

static BuildSource mem_source(MemSet *m) {
    return (BuildSource){.count = (uint64_t)m->n, .num_classes = 4, .class_names = g_names,
                         .ctx = m, .get = mem_get, .name = mem_name};
}

static BuildOptions build_opts(const char *out, int S, int c) {
    return (BuildOptions){.out_dir = out, .split = "train", .size = S,
                          .layout = SHARD_LAYOUT_SHORTER, .channels = c, .max_aspect = 3.0f,
                          .shard_bytes = BUILD_DEFAULT_SHARD_BYTES, .zstd_level = 3,
                          .threads = 2};
}

// Every image of split equals m's image i (shape, pixels, label), in order.
static void assert_dataset_equals(const char *dir, const char *split, const MemSet *m) {
    Dataset d;
    char err[2048];
    if (dataset_open(&d, dir, split, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(d.m.images, m->n);
    for (int i = 0; i < m->n; i++) {
        int si;
        uint64_t rec;
        dataset_locate(&d, (uint64_t)i, &si, &rec);
        ShardRecord r = shard_record(&d.shards[si], rec);
        assert_int_equal(r.height, m->h[i]);
        assert_int_equal(r.width, m->w[i]);
        assert_int_equal(r.label, m->label[i]);
        size_t bytes = (size_t)r.height * r.width * m->c;
        uint8_t *buf = malloc(bytes);
        if (shard_verify_record(&d.shards[si], rec, NULL, buf, bytes, err, sizeof err)) fail_msg("%s", err);
        assert_memory_equal(buf, m->pix[i], bytes);
        free(buf);
    }
    dataset_close(&d);
}

// ---------------------------------------------------------------------------------------------
// Round trips

static void test_writer_reader_round_trip_gives_exact_pixels_labels_and_header(void **state) {
    (void)state;
    MemSet m = mem_make(37, 3, 9, 11);
    const char *path = tmp_path("one.cgs");
    ShardInfo info = {3, 9, SHARD_LAYOUT_SHORTER, 4, (const char *const *)g_names, 5};
    ShardWriter w;
    char err[2048];
    if (shard_writer_open(&w, path, &info, err, sizeof err)) fail_msg("%s", err);
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    uint8_t *buf = NULL;
    size_t cap = 0;
    for (int i = 0; i < m.n; i++) {
        size_t z = shard_compress_record(cctx, 3, m.pix[i], (size_t)m.h[i] * m.w[i] * 3, &buf,
                                         &cap, err, sizeof err);
        assert_true(z > 0);
        PixelStats st;
        pixel_stats(m.pix[i], m.h[i], m.w[i], 3, &st);
        if (shard_writer_add(&w, buf, z, m.h[i], m.w[i], m.label[i], &st, err, sizeof err))
            fail_msg("%s", err);
    }
    assert_int_equal(access(path, F_OK), -1);   // nothing under the final name before finish
    if (shard_writer_finish(&w, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(count_files(g_dir, ".tmp"), 0);
    Shard s;
    if (shard_open(&s, path, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(s.num_records, m.n);
    assert_int_equal(s.channels, 3);
    assert_int_equal(s.image_size, 9);
    assert_int_equal(s.layout, SHARD_LAYOUT_SHORTER);
    assert_int_equal(s.shard_no, 5);
    assert_int_equal(s.num_classes, 4);
    for (int k = 0; k < 4; k++) assert_string_equal(s.class_names[k], g_names[k]);
    for (int i = 0; i < m.n; i++) {
        ShardRecord r = shard_record(&s, (uint64_t)i);
        assert_int_equal(r.label, m.label[i]);
        size_t bytes = (size_t)m.h[i] * m.w[i] * 3;
        uint8_t *px = malloc(bytes);
        if (shard_read_record(&s, (uint64_t)i, NULL, px, bytes, err, sizeof err)) fail_msg("%s", err);
        assert_memory_equal(px, m.pix[i], bytes);
        free(px);
    }
    shard_close(&s);
    ZSTD_freeCCtx(cctx);
    free(buf);
    mem_free(&m);
}

static void test_build_round_trip_is_exact_across_shards_and_thread_counts(void **state) {
    (void)state;
    MemSet m = mem_make(120, 3, 12, 3);
    BuildSource src = mem_source(&m);
    char err[2048];
    BuildStats st;
    BuildOptions o = build_opts(tmp_path("a"), 12, 3);
    o.shard_bytes = 20000;   // several shards
    o.threads = 1;
    if (build_shards(&src, &o, &st, err, sizeof err)) fail_msg("%s", err);
    assert_true(st.shards > 3);
    assert_int_equal(st.images, 120);
    assert_dataset_equals(tmp_path("a"), "train", &m);
    // The same build on 3 threads writes byte-identical files.
    BuildOptions o3 = o;
    o3.out_dir = tmp_path("b");
    o3.threads = 3;
    if (build_shards(&src, &o3, &st, err, sizeof err)) fail_msg("%s", err);
    for (int k = 0; k < st.shards; k++) {
        char a[600], b[600];
        snprintf(a, sizeof a, "%s/a/train-%05d.cgs", g_dir, k);
        snprintf(b, sizeof b, "%s/b/train-%05d.cgs", g_dir, k);
        size_t na, nb;
        uint8_t *da = read_all(a, &na), *db = read_all(b, &nb);
        assert_int_equal(na, nb);
        assert_memory_equal(da, db, na);
        free(da), free(db);
    }
    // Rebuilding with fewer shards removes the old extra ones.
    o.shard_bytes = BUILD_DEFAULT_SHARD_BYTES;
    if (build_shards(&src, &o, &st, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(st.shards, 1);
    assert_int_equal(count_files(tmp_path("a"), ".cgs"), 1);
    assert_dataset_equals(tmp_path("a"), "train", &m);
    mem_free(&m);
}

static void write_png_rgb(const char *path, const uint8_t *p, int h, int w, int c) {
    char err[1024];
    if (image_write_png(path, p, h, w, c, err, sizeof err)) fail_msg("%s", err);
}

static void test_imagefolder_build_of_pngs_reads_back_exactly_in_sorted_order(void **state) {
    (void)state;
    // root/{a,b}/... with square 16x16 PNGs: stored at 16 (square) they come back exactly.
    const char *root = tmp_path("root");
    mkdir(root, 0755);
    char p[700];
    const char *cls[2] = {"b_second", "a_first"};
    MemSet m = {6, 3, calloc(6, sizeof(int)), calloc(6, sizeof(int)), calloc(6, sizeof(int)),
                calloc(6, sizeof(uint8_t *)), -1};
    uint64_t seed = 9;
    for (int k = 0; k < 2; k++) {
        snprintf(p, sizeof p, "%s/%s", root, cls[k]);
        mkdir(p, 0755);
    }
    snprintf(p, sizeof p, "%s/a_first/notes.txt", root);
    write_all(p, "x", 1);
    for (int i = 0; i < 6; i++) {   // expected order: a_first/0..2 (label 0), b_second/0..2 (1)
        m.h[i] = m.w[i] = 16, m.label[i] = i / 3;
        m.pix[i] = malloc(16 * 16 * 3);
        for (int j = 0; j < 16 * 16 * 3; j++) m.pix[i][j] = (uint8_t)test_rng_next(&seed);
        snprintf(p, sizeof p, "%s/%s/img%d.PNG", root, i < 3 ? "a_first" : "b_second", i % 3);
        write_png_rgb(p, m.pix[i], 16, 16, 3);
    }
    BuildSource src;
    char err[2048];
    if (build_source_imagefolder(&src, root, false, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(src.num_classes, 2);
    assert_string_equal(src.class_names[0], "a_first");
    assert_int_equal(src.ignored, 1);
    BuildOptions o = build_opts(tmp_path("out"), 16, 3);
    o.layout = SHARD_LAYOUT_SQUARE;
    BuildStats st;
    if (build_shards(&src, &o, &st, err, sizeof err)) fail_msg("%s", err);
    build_source_free(&src);
    assert_dataset_equals(tmp_path("out"), "train", &m);
    mem_free(&m);
}

// ImageNet's val/ as distributed: a flat folder and a label file. Plain "NAME CLASS" lines and
// Kaggle's LOC_val_solution.csv (header; names without the extension; the class the first word of
// the prediction string) give the same dataset: classes in sorted order, images in path order.
static void test_flat_folder_with_a_label_file_builds_like_an_imagefolder(void **state) {
    (void)state;
    char root[600];   // tmp_path's buffers are reused
    snprintf(root, sizeof root, "%s", tmp_path("flat"));
    mkdir(root, 0755);
    MemSet m = {5, 3, calloc(5, sizeof(int)), calloc(5, sizeof(int)), calloc(5, sizeof(int)),
                calloc(5, sizeof(uint8_t *)), -1};
    static const char *const wnid[5] = {"n02", "n01", "n02", "n03", "n01"};   // of val_0..4
    uint64_t seed = 19;
    char p[700];
    for (int i = 0; i < 5; i++) {
        m.h[i] = m.w[i] = 16;
        m.label[i] = wnid[i][2] - '1';   // sorted classes n01, n02, n03
        m.pix[i] = malloc(16 * 16 * 3);
        for (int j = 0; j < 16 * 16 * 3; j++) m.pix[i][j] = (uint8_t)test_rng_next(&seed);
        snprintf(p, sizeof p, "%s/val_%d.png", root, i);
        write_png_rgb(p, m.pix[i], 16, 16, 3);
    }
    snprintf(p, sizeof p, "%s/unlisted.png", root);   // not in the label file: not read
    write_png_rgb(p, m.pix[0], 16, 16, 3);
    FILE *plain = fopen(tmp_path("labels.txt"), "w"), *kaggle = fopen(tmp_path("sol.csv"), "w");
    assert_non_null(plain), assert_non_null(kaggle);
    fprintf(kaggle, "ImageId,PredictionString\n");
    for (int i = 4; i >= 0; i--) {   // any order
        fprintf(plain, "val_%d.png %s\n", i, wnid[i]);
        fprintf(kaggle, "val_%d,%s 1 2 3 4 %s 5 6 7 8\n", i, wnid[i], wnid[i]);
    }
    fclose(plain), fclose(kaggle);
    const char *files[2] = {"labels.txt", "sol.csv"};
    for (int f = 0; f < 2; f++) {
        BuildSource src;
        char err[2048], out[64];
        if (build_source_labeled_folder(&src, root, tmp_path(files[f]), err, sizeof err))
            fail_msg("%s", err);
        assert_int_equal(src.num_classes, 3);
        assert_string_equal(src.class_names[0], "n01");
        assert_string_equal(src.class_names[2], "n03");
        assert_non_null(strstr(src.note, "1 image of "));   // counted and named, not built
        assert_non_null(strstr(src.note, "(not built): unlisted.png"));
        snprintf(out, sizeof out, "out_%d", f);
        BuildOptions o = build_opts(tmp_path(out), 16, 3);
        o.layout = SHARD_LAYOUT_SQUARE;
        BuildStats st;
        if (build_shards(&src, &o, &st, err, sizeof err)) fail_msg("%s", err);
        build_source_free(&src);
        assert_dataset_equals(tmp_path(out), "train", &m);
    }
    // A name the folder does not have, and a line without a class: refused with the line.
    FILE *bad = fopen(tmp_path("bad.txt"), "w");
    fprintf(bad, "val_0.png n01\nval_9.png n02\n");
    fclose(bad);
    BuildSource src;
    char err[2048];
    assert_int_equal(build_source_labeled_folder(&src, root, tmp_path("bad.txt"), err, sizeof err), -1);
    assert_non_null(strstr(err, "line 2: no image"));
    bad = fopen(tmp_path("bad.txt"), "w");
    fprintf(bad, "val_0.png\n");
    fclose(bad);
    assert_int_equal(build_source_labeled_folder(&src, root, tmp_path("bad.txt"), err, sizeof err), -1);
    assert_non_null(strstr(err, "line 1: expected 'NAME CLASS'"));
    mem_free(&m);
}

// An empty class folder is refused by name (it would shift every later label), or left out with
// --skip-empty-classes and named in the note.
static void test_an_empty_class_folder_is_refused_or_left_out_by_name(void **state) {
    (void)state;
    char root[600], p[700];
    snprintf(root, sizeof root, "%s", tmp_path("with_empty"));
    mkdir(root, 0755);
    const char *dirs[3] = {"a", "b_empty", "c"};
    for (int k = 0; k < 3; k++) {
        snprintf(p, sizeof p, "%s/%s", root, dirs[k]);
        mkdir(p, 0755);
    }
    uint8_t pix[8 * 8 * 3] = {0};
    snprintf(p, sizeof p, "%s/a/0.png", root);
    write_png_rgb(p, pix, 8, 8, 3);
    snprintf(p, sizeof p, "%s/c/0.png", root);
    write_png_rgb(p, pix, 8, 8, 3);
    BuildSource src;
    char err[2048];
    assert_int_equal(build_source_imagefolder(&src, root, false, err, sizeof err), -1);
    assert_non_null(strstr(err, "1 class folder without images: b_empty"));
    assert_non_null(strstr(err, "--skip-empty-classes"));
    assert_int_equal(build_source_imagefolder(&src, root, true, err, sizeof err), 0);
    assert_int_equal(src.num_classes, 2);
    assert_string_equal(src.class_names[1], "c");
    assert_non_null(strstr(src.note, "left out 1 empty class folder: b_empty"));
    // Renumbered onto a list that holds its classes and more (a val split onto train's): c is
    // label 2 there; a class outside the list is refused by name.
    char *wider[] = {"a", "b", "c"}, *narrower[] = {"a"};
    assert_int_equal(build_source_use_classes(&src, wider, 3, "train", err, sizeof err), 0);
    assert_int_equal(src.num_classes, 3);
    Image im;
    int label, warning;
    assert_int_equal(src.get(src.ctx, 1, 3, 0, &im, &label, &warning, err, sizeof err), 0);
    image_free(&im);
    assert_int_equal(label, 2);
    assert_int_equal(build_source_use_classes(&src, narrower, 1, "train", err, sizeof err), -1);
    assert_non_null(strstr(err, "class 'b' is not among the 1 classes of train"));
    build_source_free(&src);
    char *a[] = {"x", "b"}, *b[] = {"x", "c"}, *c3[] = {"x", "b", "c"};
    char diff[256];
    assert_false(class_lists_differ(a, 2, "train", a, 2, "val", diff, sizeof diff));
    assert_true(class_lists_differ(a, 2, "train", b, 2, "val", diff, sizeof diff));
    assert_string_equal(diff, "class 1 is 'b' in train, 'c' in val");
    assert_true(class_lists_differ(c3, 3, "train", a, 2, "val", diff, sizeof diff));
    assert_string_equal(diff, "3 classes in train, 2 in val (the first 2 agree)");
}

static void test_idx_build_matches_fashion_mnist_pixels_and_labels(void **state) {
    (void)state;
    if (access(FMNIST_DIR "/t10k-images-idx3-ubyte.gz", R_OK) != 0) skip();
    BuildSource src;
    char err[2048];
    if (build_source_idx(&src, FMNIST_DIR, "val", err, sizeof err)) fail_msg("%s", err);
    assert_string_equal(src.class_names[9], "Ankle boot");
    BuildOptions o = build_opts(tmp_path("fm"), src.native_size, 1);
    o.split = "val";
    o.layout = SHARD_LAYOUT_SQUARE;
    BuildStats st;
    if (build_shards(&src, &o, &st, err, sizeof err)) fail_msg("%s", err);
    build_source_free(&src);
    FmnistSplit ref;
    if (fmnist_load(FMNIST_DIR, 0, &ref, err, sizeof err)) fail_msg("%s", err);
    Dataset d;
    if (dataset_open(&d, tmp_path("fm"), "val", err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(d.m.images, 10000);
    assert_float_equal(d.m.mean[0], 0.2868, 2e-3);   // t10k pixel mean / 255
    uint8_t px[784];
    for (int i = 0; i < 10000; i++) {
        int si;
        uint64_t rec;
        dataset_locate(&d, (uint64_t)i, &si, &rec);
        if (shard_read_record(&d.shards[si], rec, NULL, px, sizeof px, err, sizeof err)) fail_msg("%s", err);
        assert_memory_equal(px, ref.images.pixels + (size_t)i * 784, 784);
        assert_int_equal(shard_record(&d.shards[si], rec).label, ref.labels.labels[i]);
    }
    dataset_close(&d);
    fmnist_free(&ref);
}

// ---------------------------------------------------------------------------------------------
// PNG variants written with libpng directly

typedef struct PngSpec {
    int color, depth, interlace;
    png_color palette[4];
    int npal;
    png_byte trans[4];
    int ntrans;
} PngSpec;

// rows: packed in libpng's own format (big-endian 16-bit samples, packed low bit depths).
static void write_png_spec(const char *path, int w, int h, const PngSpec *s, uint8_t **rows) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    if (setjmp(png_jmpbuf(png))) fail_msg("libpng write failed");
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, s->depth, s->color,
                 s->interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (s->npal) png_set_PLTE(png, info, s->palette, s->npal);
    if (s->ntrans) png_set_tRNS(png, info, s->trans, s->ntrans, NULL);
    png_write_info(png, info);
    png_write_image(png, rows);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    fclose(f);
}

static Image decode_file(const char *path, int channels) {
    Image im;
    char err[1024];
    if (image_read_file(path, channels, 0, &im, NULL, err, sizeof err)) fail_msg("%s", err);
    return im;
}

static int round16(int v) { return (int)floor(v / 257.0 + 0.5); }

static void test_png_color_types_bit_depths_palette_and_interlace_decode_exactly(void **state) {
    (void)state;
    enum { W = 13, H = 7 };   // odd sizes: partial bytes at low bit depths, every Adam7 pass
    uint64_t seed = 5;
    uint16_t val[H][W][4];   // per pixel: up to 4 random 16-bit samples
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int k = 0; k < 4; k++) val[y][x][k] = (uint16_t)test_rng_next(&seed);
    uint8_t *rows[H];
    for (int y = 0; y < H; y++) rows[y] = calloc(W * 8, 1);
    const char *path = tmp_path("v.png");
    struct { const char *name; int color, depth, chans, interlace; } cases[] = {
        {"rgb8", PNG_COLOR_TYPE_RGB, 8, 3, 0},          {"rgb8 interlaced", PNG_COLOR_TYPE_RGB, 8, 3, 1},
        {"rgba8", PNG_COLOR_TYPE_RGBA, 8, 4, 0},        {"gray8", PNG_COLOR_TYPE_GRAY, 8, 1, 0},
        {"gray+alpha8", PNG_COLOR_TYPE_GRAY_ALPHA, 8, 2, 0},
        {"rgb16", PNG_COLOR_TYPE_RGB, 16, 3, 0},        {"rgba16", PNG_COLOR_TYPE_RGBA, 16, 4, 1},
        {"gray16", PNG_COLOR_TYPE_GRAY, 16, 1, 0},      {"gray1", PNG_COLOR_TYPE_GRAY, 1, 1, 0},
        {"gray2", PNG_COLOR_TYPE_GRAY, 2, 1, 1},        {"gray4", PNG_COLOR_TYPE_GRAY, 4, 1, 0},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int d = cases[ci].depth, n = cases[ci].chans;
        uint8_t expect[H][W][3];   // RGB, or gray in [0]
        for (int y = 0; y < H; y++) {
            memset(rows[y], 0, W * 8);
            for (int x = 0; x < W; x++)
                for (int k = 0; k < n; k++) {
                    uint16_t v = val[y][x][k];
                    if (d == 16) {
                        rows[y][(x * n + k) * 2] = (uint8_t)(v >> 8), rows[y][(x * n + k) * 2 + 1] = (uint8_t)v;
                        if (k < 3) expect[y][x][k] = (uint8_t)round16(v);
                    } else if (d == 8) {
                        rows[y][x * n + k] = (uint8_t)v;
                        if (k < 3) expect[y][x][k] = (uint8_t)v;
                    } else {   // gray at 1/2/4 bits, packed most significant first
                        int s = v & ((1 << d) - 1), per = 8 / d;
                        rows[y][x / per] |= (uint8_t)(s << (8 - d * (x % per + 1)));
                        expect[y][x][0] = (uint8_t)(s * 255 / ((1 << d) - 1));
                    }
                }
        }
        PngSpec spec = {.color = cases[ci].color, .depth = d, .interlace = cases[ci].interlace};
        write_png_spec(path, W, H, &spec, rows);
        int gray = !(cases[ci].color & PNG_COLOR_MASK_COLOR);
        Image rgb = decode_file(path, 3), g = decode_file(path, 1);
        assert_int_equal(rgb.height, H);
        assert_int_equal(rgb.width, W);
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                const uint8_t *e = expect[y][x], *got = rgb.pixels + (y * W + x) * 3;
                uint8_t want[3] = {e[0], gray ? e[0] : e[1], gray ? e[0] : e[2]};
                uint8_t want_g = gray ? e[0] : (uint8_t)((want[0] * 19595u + want[1] * 38470u +
                                                          want[2] * 7471u + 0x8000u) >> 16);
                if (memcmp(got, want, 3) || g.pixels[y * W + x] != want_g)
                    fail_msg("%s: pixel (%d, %d) is %d %d %d / gray %d; expected %d %d %d / %d",
                             cases[ci].name, y, x, got[0], got[1], got[2], g.pixels[y * W + x],
                             want[0], want[1], want[2], want_g);
            }
        image_free(&rgb);
        image_free(&g);
    }
    // Palette (2-bit indices) with transparency: the palette colours, alpha dropped.
    PngSpec pal = {.color = PNG_COLOR_TYPE_PALETTE, .depth = 2, .npal = 4,
                   .palette = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {10, 20, 30}},
                   .trans = {0, 128}, .ntrans = 2};
    for (int y = 0; y < H; y++) {
        memset(rows[y], 0, W * 8);
        for (int x = 0; x < W; x++) rows[y][x / 4] |= (uint8_t)(((x + y) % 4) << (6 - 2 * (x % 4)));
    }
    write_png_spec(path, W, H, &pal, rows);
    Image im = decode_file(path, 3);
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            png_color c = pal.palette[(x + y) % 4];
            const uint8_t *got = im.pixels + (y * W + x) * 3;
            assert_int_equal(got[0], c.red);
            assert_int_equal(got[1], c.green);
            assert_int_equal(got[2], c.blue);
        }
    image_free(&im);
    for (int y = 0; y < H; y++) free(rows[y]);
}

static void smooth_image(uint8_t *p, int h, int w, int c) {
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int k = 0; k < c; k++)
                p[(y * w + x) * c + k] = (uint8_t)(128 + 100 * sin(0.11 * x + 0.7 * k) * cos(0.07 * y - 0.3 * k));
}

static void test_jpeg_quality_100_decodes_within_tolerance_gray_and_rgb(void **state) {
    (void)state;
    enum { H = 37, W = 53 };
    for (int c = 1; c <= 3; c += 2) {
        uint8_t src[H * W * 3];
        smooth_image(src, H, W, c);
        uint8_t *jpg;
        size_t size;
        char err[1024];
        if (image_encode_jpeg(src, H, W, c, 100, &jpg, &size, err, sizeof err)) fail_msg("%s", err);
        assert_int_equal(image_format(jpg, size), IMAGE_JPEG);
        Image im;
        int warn = 1;
        if (image_decode(jpg, size, "q100.jpg", c, 0, &im, &warn, err, sizeof err)) fail_msg("%s", err);
        assert_int_equal(warn, 0);
        assert_int_equal(im.height, H);
        assert_int_equal(im.width, W);
        int maxerr = 0;
        double sum = 0;
        for (int i = 0; i < H * W * c; i++) {
            int d = abs(im.pixels[i] - src[i]);
            maxerr = d > maxerr ? d : maxerr;
            sum += d;
        }
        printf("    jpeg q100 %d channel%s: max error %d, mean %.3f\n", c, c > 1 ? "s" : "", maxerr,
               sum / (H * W * c));
        assert_true(maxerr <= JPEG_Q100_MAX_ERR);
        assert_true(sum / (H * W * c) <= JPEG_Q100_MEAN_ERR);
        image_free(&im);
        // DCT scaling: asking for a shorter side of at most 10 decodes at 1/2 scale or less.
        if (image_decode(jpg, size, "q100.jpg", c, 10, &im, NULL, err, sizeof err)) fail_msg("%s", err);
        assert_true(im.height >= 10 && im.height < H && im.width < W);
        image_free(&im);
        image_free_jpeg(jpg);
    }
}

// CMYK JPEGs (Adobe, inverted ink as Photoshop writes them): R = C' K' / 255, as PIL converts.
static void test_cmyk_jpeg_decodes_to_rgb_by_the_adobe_convention(void **state) {
    (void)state;
    enum { H = 16, W = 16 };
    uint8_t cmyk[H * W * 4];
    for (int i = 0; i < H * W; i++)   // flat colour: no DCT error to speak of
        cmyk[4 * i] = 200, cmyk[4 * i + 1] = 100, cmyk[4 * i + 2] = 50, cmyk[4 * i + 3] = 180;
    tjhandle tj = tjInitCompress();
    unsigned char *jpg = NULL;
    unsigned long size = 0;
    assert_int_equal(tjCompress2(tj, cmyk, W, 0, H, TJPF_CMYK, &jpg, &size, TJSAMP_444, 100, 0), 0);
    tjDestroy(tj);
    Image im;
    char err[1024];
    if (image_decode(jpg, size, "cmyk.jpg", 3, 0, &im, NULL, err, sizeof err)) fail_msg("%s", err);
    int want[3] = {200 * 180 / 255, 100 * 180 / 255, 50 * 180 / 255};
    for (int i = 0; i < H * W; i++)
        for (int k = 0; k < 3; k++) assert_true(abs(im.pixels[3 * i + k] - want[k]) <= 2);
    image_free(&im);
    tjFree(jpg);
}

// ---------------------------------------------------------------------------------------------
// Bad input

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

// A PNG whose IHDR claims w x h (valid CRC), then IEND.
static size_t absurd_png(uint8_t *b, uint32_t w, uint32_t h) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    memcpy(b, sig, 8);
    put_be32(b + 8, 13);
    memcpy(b + 12, "IHDR", 4);
    put_be32(b + 16, w);
    put_be32(b + 20, h);
    b[24] = 8, b[25] = 2, b[26] = b[27] = b[28] = 0;
    put_be32(b + 29, (uint32_t)crc32(0, b + 12, 17));
    put_be32(b + 33, 0);
    memcpy(b + 37, "IEND", 4);
    put_be32(b + 41, (uint32_t)crc32(0, b + 37, 4));
    return 45;
}

static void test_bad_images_give_errors_naming_the_file(void **state) {
    (void)state;
    Image im;
    char err[1024];
    uint8_t b[64];
    size_t n = absurd_png(b, 100000, 100000);
    assert_int_equal(image_decode(b, n, "huge.png", 3, 0, &im, NULL, err, sizeof err), -1);
    assert_contains(err, "huge.png");
    assert_contains(err, "100000 x 100000");
    n = absurd_png(b, 40000, 40000);   // sides fine, 1.6 Gpixel refused
    assert_int_equal(image_decode(b, n, "bomb.png", 3, 0, &im, NULL, err, sizeof err), -1);
    assert_contains(err, "40000 x 40000");
    // A JPEG whose frame header is patched to 60000 x 60000.
    uint8_t px[16 * 16 * 3];
    smooth_image(px, 16, 16, 3);
    uint8_t *jpg;
    size_t size;
    if (image_encode_jpeg(px, 16, 16, 3, 90, &jpg, &size, err, sizeof err)) fail_msg("%s", err);
    uint8_t *copy = malloc(size);
    memcpy(copy, jpg, size);
    for (size_t i = 2; i + 8 < size; i++)
        if (copy[i] == 0xFF && (copy[i + 1] == 0xC0 || copy[i + 1] == 0xC2)) {
            copy[i + 5] = 0xEA, copy[i + 6] = 0x60, copy[i + 7] = 0xEA, copy[i + 8] = 0x60;
            break;
        }
    assert_int_equal(image_decode(copy, size, "huge.jpg", 3, 0, &im, NULL, err, sizeof err), -1);
    assert_contains(err, "huge.jpg");
    assert_contains(err, "60000 x 60000");
    // Truncated JPEG: an error or a recovered decode with a warning, never a crash.
    int warn = 0;
    int rc = image_decode(jpg, size / 2, "half.jpg", 3, 0, &im, &warn, err, sizeof err);
    if (rc == 0) {
        assert_int_equal(warn, 1);
        image_free(&im);
    } else {
        assert_contains(err, "half.jpg");
    }
    image_free_jpeg(jpg);
    free(copy);
    // Truncated PNG, empty file, not an image.
    const char *p = tmp_path("t.png");
    write_png_rgb(p, px, 16, 16, 3);
    size_t pn;
    uint8_t *pb = read_all(p, &pn);
    assert_int_equal(image_decode(pb, pn / 2, "cut.png", 3, 0, &im, NULL, err, sizeof err), -1);
    assert_contains(err, "cut.png");
    free(pb);
    assert_int_equal(image_decode((const uint8_t *)"", 0, "empty.png", 3, 0, &im, NULL, err, sizeof err), -1);
    assert_contains(err, "empty.png");
    assert_int_equal(image_decode((const uint8_t *)"hello", 5, "text.jpg", 3, 0, &im, NULL, err, sizeof err), -1);
    assert_contains(err, "not a PNG or JPEG");
}

// A valid two-record shard at path; returns its bytes (malloc'd) and size.
static uint8_t *good_shard(const char *path, size_t *size) {
    MemSet m = mem_make(2, 1, 6, 77);
    ShardInfo info = {1, 6, SHARD_LAYOUT_SHORTER, 4, (const char *const *)g_names, 0};
    ShardWriter w;
    char err[1024];
    if (shard_writer_open(&w, path, &info, err, sizeof err)) fail_msg("%s", err);
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    uint8_t *buf = NULL;
    size_t cap = 0;
    for (int i = 0; i < 2; i++) {
        size_t z = shard_compress_record(cctx, 3, m.pix[i], (size_t)m.h[i] * m.w[i], &buf, &cap, err, sizeof err);
        if (shard_writer_add(&w, buf, z, m.h[i], m.w[i], m.label[i], NULL, err, sizeof err)) fail_msg("%s", err);
    }
    if (shard_writer_finish(&w, err, sizeof err)) fail_msg("%s", err);
    ZSTD_freeCCtx(cctx);
    free(buf);
    mem_free(&m);
    return read_all(path, size);
}

static void expect_open_error(const char *name, const uint8_t *data, size_t size, const char *part) {
    const char *p = tmp_path(name);
    write_all(p, data, size);
    Shard s;
    char err[2048];
    if (shard_open(&s, p, err, sizeof err) == 0) fail_msg("%s: opened; expected '%s'", name, part);
    assert_contains(err, p);
    assert_contains(err, part);
}

static void test_damaged_shards_are_rejected_with_file_and_record_named(void **state) {
    (void)state;
    size_t n;
    uint8_t *good = good_shard(tmp_path("good.cgs"), &n);
    uint8_t *bad = malloc(n);
    expect_open_error("zero.cgs", good, 0, "empty file");
    expect_open_error("short.cgs", good, 40, "truncated");
    expect_open_error("cut.cgs", good, n - 1, "truncated");
    expect_open_error("half.cgs", good, n / 2, "truncated");
    memcpy(bad, good, n);
    memcpy(bad, "NOTSHARD", 8);
    expect_open_error("magic.cgs", bad, n, "not a cgspn shard");
    memset(bad, 0, SHARD_HEADER_FIXED);   // what a crash before the header write leaves
    expect_open_error("blank.cgs", bad, n, "did not finish");
    memcpy(bad, good, n);
    bad[SH_CHANNELS] ^= 0x10;
    expect_open_error("hdr.cgs", bad, n, "header checksum");
    memcpy(bad, good, n);
    bad[n - SHARD_FOOTER_BYTES - 5] ^= 0x01;   // inside the index
    expect_open_error("index.cgs", bad, n, "index checksum");
    memcpy(bad, good, n);
    bad[n - 3] ^= 0x40;   // footer CRC
    expect_open_error("footer.cgs", bad, n, "footer");
    memcpy(bad, good, n);
    memcpy(bad + n, "", 0);
    uint8_t *longer = malloc(n + 7);
    memcpy(longer, good, n);
    memset(longer + n, 0, 7);
    expect_open_error("extra.cgs", longer, n + 7, "extra bytes");
    free(longer);

    // A flipped byte inside record 1's data: the shard opens (records are checked when read),
    // then verify and read both fail naming the file and the record.
    Shard s;
    char err[2048];
    if (shard_open(&s, tmp_path("good.cgs"), err, sizeof err)) fail_msg("%s", err);
    ShardRecord r = shard_record(&s, 1);
    shard_close(&s);
    memcpy(bad, good, n);
    bad[r.offset + r.bytes / 2] ^= 0x20;
    const char *p = tmp_path("flip.cgs");
    write_all(p, bad, n);
    if (shard_open(&s, p, err, sizeof err)) fail_msg("%s", err);
    uint8_t px[6 * 18 * 1];
    assert_int_equal(shard_verify_record(&s, 1, NULL, px, sizeof px, err, sizeof err), -1);
    assert_contains(err, p);
    assert_contains(err, "record 1");
    assert_contains(err, "checksum mismatch");
    assert_int_equal(shard_read_record(&s, 1, NULL, px, sizeof px, err, sizeof err), -1);
    assert_contains(err, "record 1");
    assert_int_equal(shard_verify_record(&s, 0, NULL, px, sizeof px, err, sizeof err), 0);
    shard_close(&s);
    free(bad);
    free(good);
}

static void test_unfinished_writer_leaves_only_a_tmp_file_that_readers_reject(void **state) {
    (void)state;
    const char *path = tmp_path("crash.cgs");
    ShardInfo info = {1, 4, SHARD_LAYOUT_SQUARE, 4, (const char *const *)g_names, 0};
    ShardWriter w;
    char err[2048];
    if (shard_writer_open(&w, path, &info, err, sizeof err)) fail_msg("%s", err);
    uint8_t frame[64] = {0};
    assert_int_equal(shard_writer_add(&w, frame, sizeof frame, 4, 4, 1, NULL, err, sizeof err), 0);
    // "Crash": the process stops here. Only path.tmp exists, and it does not read as a shard.
    assert_int_equal(access(path, F_OK), -1);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    Shard s;
    assert_int_equal(shard_open(&s, tmp, err, sizeof err), -1);
    assert_contains(err, "did not finish");
    shard_writer_abort(&w);
    assert_int_equal(access(tmp, F_OK), -1);
    // A folder without a manifest is an unfinished build, with a hint.
    Dataset d;
    assert_int_equal(dataset_open(&d, g_dir, "train", err, sizeof err), -1);
    assert_contains(err, "train.manifest");
    assert_contains(err, "cgspn data build");
}

static void test_build_skips_and_counts_bad_images_and_strict_fails_cleanly(void **state) {
    (void)state;
    const char *root = tmp_path("imgs");
    char p[700];
    mkdir(root, 0755);
    snprintf(p, sizeof p, "%s/c0", root);
    mkdir(p, 0755);
    uint8_t px[20 * 24 * 3];
    smooth_image(px, 20, 24, 3);
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/c0/good%d.png", root, i);
        write_png_rgb(p, px, 20, 24, 3);
    }
    snprintf(p, sizeof p, "%s/c0/z1_empty.png", root);
    write_all(p, "", 0);
    snprintf(p, sizeof p, "%s/c0/z2_text.jpg", root);
    write_all(p, "not a jpeg", 10);
    uint8_t b[64];
    snprintf(p, sizeof p, "%s/c0/z3_huge.png", root);
    write_all(p, b, absurd_png(b, 100000, 100000));
    char err[4096];
    BuildSource src;
    if (build_source_imagefolder(&src, root, false, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(src.count, 6);
    // Default: skipped and counted, the rest built and valid.
    BuildOptions o = build_opts(tmp_path("ok"), 16, 3);
    BuildStats st;
    if (build_shards(&src, &o, &st, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(st.images, 3);
    assert_int_equal(st.skipped, 3);
    Dataset d;
    if (dataset_open(&d, tmp_path("ok"), "train", err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(d.m.images, 3);
    assert_int_equal(shard_record(&d.shards[0], 0).height, 16);   // shorter side 16
    assert_int_equal(shard_record(&d.shards[0], 0).width, 19);    // 24 * 16 / 20 = 19.2
    dataset_close(&d);
    // Strict: fails naming the first bad file; no manifest, no shard, no .tmp left.
    o.out_dir = tmp_path("strict");
    o.strict = 1;
    o.shard_bytes = 1;   // a shard per image, so a shard was complete before the failure
    assert_int_equal(build_shards(&src, &o, &st, err, sizeof err), -1);
    assert_contains(err, "z1_empty.png");
    assert_int_equal(count_files(tmp_path("strict"), ".manifest"), 0);
    assert_int_equal(count_files(tmp_path("strict"), ".cgs"), 0);
    assert_int_equal(count_files(tmp_path("strict"), ".tmp"), 0);
    build_source_free(&src);
}

static void test_manifest_problems_are_reported_with_the_file(void **state) {
    (void)state;
    MemSet m = mem_make(5, 1, 6, 1);
    BuildSource src = mem_source(&m);
    BuildOptions o = build_opts(tmp_path("ds"), 6, 1);
    BuildStats st;
    char err[2048];
    if (build_shards(&src, &o, &st, err, sizeof err)) fail_msg("%s", err);
    const char *man = tmp_path("ds/train.manifest");
    size_t n;
    uint8_t *text = read_all(man, &n);
    Dataset d;
    write_all(man, text, n / 2);   // cut short
    assert_int_equal(dataset_open(&d, tmp_path("ds"), "train", err, sizeof err), -1);
    assert_contains(err, "train.manifest");
    write_all(man, "hello\n", 6);
    assert_int_equal(dataset_open(&d, tmp_path("ds"), "train", err, sizeof err), -1);
    assert_contains(err, "not a cgspn shard manifest");
    write_all(man, text, n);
    unlink(tmp_path("ds/train-00000.cgs"));   // a listed shard is missing
    assert_int_equal(dataset_open(&d, tmp_path("ds"), "train", err, sizeof err), -1);
    assert_contains(err, "train-00000.cgs");
    free(text);
    mem_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_writer_reader_round_trip_gives_exact_pixels_labels_and_header, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_build_round_trip_is_exact_across_shards_and_thread_counts, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_flat_folder_with_a_label_file_builds_like_an_imagefolder, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_imagefolder_build_of_pngs_reads_back_exactly_in_sorted_order, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_an_empty_class_folder_is_refused_or_left_out_by_name, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_idx_build_matches_fashion_mnist_pixels_and_labels, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_png_color_types_bit_depths_palette_and_interlace_decode_exactly, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_jpeg_quality_100_decodes_within_tolerance_gray_and_rgb, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_cmyk_jpeg_decodes_to_rgb_by_the_adobe_convention, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_bad_images_give_errors_naming_the_file, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_damaged_shards_are_rejected_with_file_and_record_named, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_unfinished_writer_leaves_only_a_tmp_file_that_readers_reject, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_build_skips_and_counts_bad_images_and_strict_fails_cleanly, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_manifest_problems_are_reported_with_the_file, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
