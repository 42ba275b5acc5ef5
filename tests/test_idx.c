// IDX reader: exact round trips (plain and gzip), and a clear error for each broken file.
// Not testlib.h: its test_free() collides with cmocka.h's test_free macro (cmocka 1.1).
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include "testlib.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include "../data/idx.h"

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

static char g_dir[256];   // a fresh temp folder per test

static int setup_dir(void **state) { return test_make_temp_dir(g_dir, sizeof g_dir, "idx"); }
static int teardown_dir(void **state) { return test_remove_dir(g_dir); }

static const char *tmp_path(const char *name) {
    static char paths[8][512];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 512, "%s/%s", g_dir, name);
    return p;
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

// Header (magic, dims) then `bytes` bytes of data; gzip'd when gz. Returns the path.
static const char *write_idx(const char *name, int gz, uint32_t magic, int ndim,
                             const uint32_t *dims, const uint8_t *data, size_t bytes) {
    const char *path = tmp_path(name);
    uint8_t h[16];
    put_be32(h, magic);
    for (int d = 0; d < ndim; d++) put_be32(h + 4 + 4 * d, dims[d]);
    size_t hn = 4 + 4 * (size_t)ndim;
    if (gz) {
        gzFile g = gzopen(path, "wb");
        assert_non_null(g);
        assert_int_equal(gzwrite(g, h, (unsigned)hn), (int)hn);
        if (bytes) assert_int_equal(gzwrite(g, data, (unsigned)bytes), (int)bytes);
        assert_int_equal(gzclose(g), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(h, 1, hn, f), hn);
        if (bytes) assert_int_equal(fwrite(data, 1, bytes, f), bytes);
        assert_int_equal(fclose(f), 0);
    }
    return path;
}

static const char *write_raw(const char *name, const void *data, size_t bytes) {
    const char *path = tmp_path(name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (bytes) assert_int_equal(fwrite(data, 1, bytes, f), bytes);
    assert_int_equal(fclose(f), 0);
    return path;
}

static uint8_t g_pix[3 * 5 * 7];
static uint8_t g_lab[3] = {9, 0, 4};

static void fill_pixels(void) {
    for (size_t i = 0; i < sizeof g_pix; i++) g_pix[i] = (uint8_t)(i * 37 + 11);
}

static void test_idx_plain_and_gzip_files_read_back_exactly(void **state) {
    fill_pixels();
    uint32_t idims[3] = {3, 5, 7}, ldims[1] = {3};
    for (int gz = 0; gz < 2; gz++) {
        const char *ip = write_idx(gz ? "im.gz" : "im", gz, IDX_MAGIC_IMAGES, 3, idims, g_pix, sizeof g_pix);
        const char *lp = write_idx(gz ? "lb.gz" : "lb", gz, IDX_MAGIC_LABELS, 1, ldims, g_lab, sizeof g_lab);
        IdxImages im;
        IdxLabels lb;
        char err[1024];
        if (idx_load_images(ip, &im, err, sizeof err)) fail_msg("%s", err);
        if (idx_load_labels(lp, &lb, err, sizeof err)) fail_msg("%s", err);
        assert_int_equal(im.count, 3);
        assert_int_equal(im.rows, 5);     // rows and cols differ, so a swap would show
        assert_int_equal(im.cols, 7);
        assert_memory_equal(im.pixels, g_pix, sizeof g_pix);
        assert_int_equal(lb.count, 3);
        assert_memory_equal(lb.labels, g_lab, sizeof g_lab);
        idx_free_images(&im);
        idx_free_labels(&lb);
        assert_null(im.pixels);
    }
}

static void test_idx_wrong_magic_names_file_and_expected_magic(void **state) {
    uint32_t ldims[1] = {3};
    const char *p = write_idx("labels-as-images", 0, IDX_MAGIC_LABELS, 1, ldims, g_lab, 3);
    IdxImages im;
    char err[1024];
    assert_int_equal(idx_load_images(p, &im, err, sizeof err), -1);
    assert_contains(err, p);
    assert_contains(err, "magic number 0x00000801");
    assert_contains(err, "expected 0x00000803");
    assert_contains(err, "label file");   // hint: it is the other kind
    assert_null(im.pixels);

    uint32_t idims[3] = {1, 1, 1};
    uint8_t px = 1;
    p = write_idx("little-endian", 0, 0x03080000u, 3, idims, &px, 1);
    assert_int_equal(idx_load_images(p, &im, err, sizeof err), -1);
    assert_contains(err, "little-endian");

    IdxLabels lb;
    p = write_raw("text", "hello world, not idx", 20);
    assert_int_equal(idx_load_labels(p, &lb, err, sizeof err), -1);
    assert_contains(err, p);
    assert_contains(err, "expected 0x00000801");
}

static void test_idx_truncated_files_say_how_much_is_missing(void **state) {
    fill_pixels();
    uint32_t idims[3] = {3, 5, 7};
    IdxImages im;
    char err[1024];
    for (int gz = 0; gz < 2; gz++) {
        const char *p = write_idx(gz ? "short.gz" : "short", gz, IDX_MAGIC_IMAGES, 3, idims, g_pix, 40);
        assert_int_equal(idx_load_images(p, &im, err, sizeof err), -1);
        assert_contains(err, p);
        assert_contains(err, "truncated");
        assert_contains(err, "40 of the 105 pixel bytes");
        assert_null(im.pixels);
    }
    // A gzip stream cut in the middle reads as a short file too.
    const char *whole = write_idx("cut.gz", 1, IDX_MAGIC_IMAGES, 3, idims, g_pix, sizeof g_pix);
    FILE *f = fopen(whole, "rb");
    uint8_t buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    const char *cut = write_raw("cut2.gz", buf, n / 2);
    assert_int_equal(idx_load_images(cut, &im, err, sizeof err), -1);
    assert_contains(err, cut);
    assert_contains(err, "truncated");

    // Header cut short.
    uint8_t h[10] = {0, 0, 8, 3, 0, 0, 0, 1, 0, 0};
    const char *p = write_raw("short-header", h, sizeof h);
    assert_int_equal(idx_load_images(p, &im, err, sizeof err), -1);
    assert_contains(err, "truncated header: 10 of 16 bytes");

    // Labels: header promises 5, file has 3.
    uint32_t ldims[1] = {5};
    IdxLabels lb;
    p = write_idx("short-labels", 0, IDX_MAGIC_LABELS, 1, ldims, g_lab, 3);
    assert_int_equal(idx_load_labels(p, &lb, err, sizeof err), -1);
    assert_contains(err, "3 of the 5 labels");
}

static void test_idx_empty_file_and_missing_file_are_errors(void **state) {
    IdxImages im;
    IdxLabels lb;
    char err[1024];
    const char *p = write_raw("empty", NULL, 0);
    assert_int_equal(idx_load_images(p, &im, err, sizeof err), -1);
    assert_contains(err, p);
    assert_contains(err, "empty file");
    assert_int_equal(idx_load_labels(p, &lb, err, sizeof err), -1);
    assert_contains(err, "empty file");

    p = tmp_path("does-not-exist");
    assert_int_equal(idx_load_images(p, &im, err, sizeof err), -1);
    assert_contains(err, p);
    assert_contains(err, "No such file");
}

static void test_idx_absurd_dims_and_trailing_data_are_errors(void **state) {
    IdxImages im;
    char err[1024];
    uint32_t big[3] = {2, 5000, 28};
    const char *p = write_idx("huge-rows", 0, IDX_MAGIC_IMAGES, 3, big, NULL, 0);
    assert_int_equal(idx_load_images(p, &im, err, sizeof err), -1);
    assert_contains(err, p);
    assert_contains(err, "5000");
    assert_contains(err, "corrupt header");

    uint32_t many[3] = {200000000u, 28, 28};
    p = write_idx("huge-count", 0, IDX_MAGIC_IMAGES, 3, many, NULL, 0);
    assert_int_equal(idx_load_images(p, &im, err, sizeof err), -1);
    assert_contains(err, "200000000");

    uint32_t zero[3] = {1, 0, 28};
    p = write_idx("zero-rows", 0, IDX_MAGIC_IMAGES, 3, zero, NULL, 0);
    assert_int_equal(idx_load_images(p, &im, err, sizeof err), -1);

    fill_pixels();
    uint32_t dims[3] = {2, 5, 7};   // 70 bytes promised, 105 present
    p = write_idx("long", 0, IDX_MAGIC_IMAGES, 3, dims, g_pix, sizeof g_pix);
    assert_int_equal(idx_load_images(p, &im, err, sizeof err), -1);
    assert_contains(err, "longer than its header says");
}

static void test_idx_corrupt_gzip_is_an_error(void **state) {
    // Incompressible-looking data so the deflate stream holds literal bytes we can flip.
    uint8_t px[4 * 16 * 16];
    uint64_t s = 12345;
    for (size_t i = 0; i < sizeof px; i++) s = s * 6364136223846793005ull + 1, px[i] = (uint8_t)(s >> 56);
    uint32_t dims[3] = {4, 16, 16};
    const char *p = write_idx("corrupt.gz", 1, IDX_MAGIC_IMAGES, 3, dims, px, sizeof px);
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    fseek(f, -12, SEEK_END);            // inside the stored data, before the CRC trailer
    int c = fgetc(f);
    fseek(f, -12, SEEK_END);
    fputc(c ^ 0x5a, f);
    fclose(f);
    IdxImages im;
    char err[1024];
    assert_int_equal(idx_load_images(p, &im, err, sizeof err), -1);
    assert_contains(err, p);
    assert_contains(err, "corrupt gzip data");
    assert_null(im.pixels);
}

static void test_fmnist_load_checks_counts_and_labels(void **state) {
    fill_pixels();
    uint32_t idims[3] = {3, 5, 7}, ldims[1] = {3}, ldims2[1] = {2};
    char err[1024];
    FmnistSplit s;

    // Train split gzip'd, test split plain (the loader takes either name).
    write_idx("train-images-idx3-ubyte.gz", 1, IDX_MAGIC_IMAGES, 3, idims, g_pix, sizeof g_pix);
    write_idx("train-labels-idx1-ubyte.gz", 1, IDX_MAGIC_LABELS, 1, ldims, g_lab, 3);
    write_idx("t10k-images-idx3-ubyte", 0, IDX_MAGIC_IMAGES, 3, idims, g_pix, sizeof g_pix);
    write_idx("t10k-labels-idx1-ubyte", 0, IDX_MAGIC_LABELS, 1, ldims2, g_lab, 2);
    if (fmnist_load(g_dir, 1, &s, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(s.images.count, 3);
    assert_int_equal(s.labels.count, 3);
    assert_int_equal(s.labels.labels[0], 9);
    assert_memory_equal(s.images.pixels, g_pix, sizeof g_pix);
    fmnist_free(&s);

    assert_int_equal(fmnist_load(g_dir, 0, &s, err, sizeof err), -1);   // 3 images, 2 labels
    assert_contains(err, "t10k-images-idx3-ubyte has 3 images");
    assert_contains(err, "t10k-labels-idx1-ubyte has 2 labels");
    assert_null(s.images.pixels);

    uint8_t bad[3] = {1, 12, 3};
    write_idx("train-labels-idx1-ubyte.gz", 1, IDX_MAGIC_LABELS, 1, ldims, bad, 3);
    assert_int_equal(fmnist_load(g_dir, 1, &s, err, sizeof err), -1);
    assert_contains(err, "label 12 at index 1");
    assert_contains(err, "0..9");

    char missing[512];
    snprintf(missing, sizeof missing, "%s/nowhere", g_dir);
    assert_int_equal(fmnist_load(missing, 1, &s, err, sizeof err), -1);
    assert_contains(err, "nowhere/train-images-idx3-ubyte.gz");
    assert_contains(err, "dataset-fashion-mnist");
}

static void test_fmnist_real_train_split_has_60000_28x28_images_first_label_9(void **state) {
    struct stat st;
    if (stat(FMNIST_DIR, &st) != 0) {
        print_message("    " FMNIST_DIR " absent (Debian's dataset-fashion-mnist): skipped\n");
        skip();
    }
    FmnistSplit s;
    char err[1024];
    if (fmnist_load(FMNIST_DIR, 1, &s, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(s.images.count, 60000);
    assert_int_equal(s.images.rows, 28);
    assert_int_equal(s.images.cols, 28);
    assert_int_equal(s.labels.labels[0], 9);   // the first training image is an ankle boot
    fmnist_free(&s);
    if (fmnist_load(FMNIST_DIR, 0, &s, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(s.images.count, 10000);
    fmnist_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_idx_plain_and_gzip_files_read_back_exactly, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_idx_wrong_magic_names_file_and_expected_magic, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_idx_truncated_files_say_how_much_is_missing, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_idx_empty_file_and_missing_file_are_errors, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_idx_absurd_dims_and_trailing_data_are_errors, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_idx_corrupt_gzip_is_an_error, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_fmnist_load_checks_counts_and_labels, setup_dir, teardown_dir),
        cmocka_unit_test(test_fmnist_real_train_split_has_60000_28x28_images_first_label_9),
    };
    return cmocka_run_group_tests_name("idx", tests, NULL, NULL);
}
