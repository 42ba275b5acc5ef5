// `cgspn data inspect DIR`: per split, counts per class, stored sizes, bytes, mean/std, and a
// PNG contact sheet (a row of images per class).
#include "data_cmd.h"
#include "../data/dataset.h"
#include "../data/image.h"
#include "../data/resize.h"
#include "../data/shard_format.h"
#include "../kernels/error.h"
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#define SHEET_MAX_CLASSES 20   // rows of the contact sheet
#define SHEET_GAP 2            // pixels between cells

// Contact sheet of up to per_class images of each of the first classes, cell x cell each.
static void write_sheet(const Dataset *d, const char *path, int per_class) {
    const Manifest *m = &d->m;
    int rows = m->num_classes < SHEET_MAX_CLASSES ? m->num_classes : SHEET_MAX_CLASSES;
    int S = m->image_size, C = m->channels;
    int cell = S < 64 ? S * ((64 + S - 1) / S) : S > 128 ? 128 : S;
    int W = per_class * (cell + SHEET_GAP) + SHEET_GAP, H = rows * (cell + SHEET_GAP) + SHEET_GAP;
    uint8_t *sheet = cg_malloc((size_t)W * H * C);
    memset(sheet, 96, (size_t)W * H * C);
    int *filled = cg_calloc((size_t)rows, sizeof(int));
    uint8_t *raw = NULL, *tile = cg_malloc((size_t)cell * cell * C);
    size_t cap = 0;
    ResizeScratch rs = {0};
    ZSTD_DCtx *dctx = ZSTD_createDCtx();
    char err[1024];
    int todo = rows * per_class;
    for (int si = 0; si < m->num_shards && todo > 0; si++) {
        const Shard *s = &d->shards[si];
        for (uint64_t i = 0; i < s->num_records && todo > 0; i++) {
            ShardRecord r = shard_record(s, i);
            if (r.label >= rows || filled[r.label] >= per_class) continue;
            size_t need = (size_t)r.height * r.width * C;
            if (need > cap) free(raw), raw = cg_malloc(need), cap = need;
            if (shard_read_record(s, i, dctx, raw, cap, err, sizeof err)) {
                fprintf(stderr, "cgspn: %s\n", err);
                continue;
            }
            int side = r.height < r.width ? r.height : r.width;   // centre square
            resize_crop_u8(raw, r.height, r.width, C, (float)((r.width - side) / 2),
                           (float)((r.height - side) / 2), (float)side, (float)side, tile, cell,
                           cell, RESIZE_BILINEAR, &rs);
            int x0 = SHEET_GAP + filled[r.label] * (cell + SHEET_GAP);
            int y0 = SHEET_GAP + r.label * (cell + SHEET_GAP);
            for (int y = 0; y < cell; y++)
                memcpy(sheet + ((size_t)(y0 + y) * W + x0) * C, tile + (size_t)y * cell * C,
                       (size_t)cell * C);
            filled[r.label]++;
            todo--;
        }
    }
    if (image_write_png(path, sheet, H, W, C, err, sizeof err))
        fprintf(stderr, "cgspn: contact sheet not written: %s\n", err);
    else
        printf("  contact sheet: %s (%d classes x up to %d images, %d px cells; row k = class k)\n",
               path, rows, per_class, cell);
    ZSTD_freeDCtx(dctx);
    resize_scratch_free(&rs);
    free(raw), free(tile), free(filled), free(sheet);
}

static void inspect_split(const char *dir, const char *split, const char *sheet, int per_class) {
    Dataset d;
    char err[4096];
    if (dataset_open(&d, dir, split, err, sizeof err)) CG_FAIL("", "%s", err);
    const Manifest *m = &d.m;
    uint64_t *per = cg_calloc((size_t)m->num_classes, sizeof(uint64_t));
    uint64_t file_bytes = 0, stored = 0;
    int hmin = 1 << 30, hmax = 0, wmin = 1 << 30, wmax = 0;
    double hsum = 0, wsum = 0;
    for (int si = 0; si < m->num_shards; si++) {
        const Shard *s = &d.shards[si];
        file_bytes += s->size;
        for (uint64_t i = 0; i < s->num_records; i++) {
            ShardRecord r = shard_record(s, i);
            per[r.label]++;
            stored += r.bytes;
            hmin = r.height < hmin ? r.height : hmin, hmax = r.height > hmax ? r.height : hmax;
            wmin = r.width < wmin ? r.width : wmin, wmax = r.width > wmax ? r.width : wmax;
            hsum += r.height, wsum += r.width;
        }
    }
    uint64_t N = m->images ? m->images : 1;
    printf("%s/%s: %llu images, %d classes, %d shard%s, %.1f MiB\n", dir, split,
           (unsigned long long)m->images, m->num_classes, m->num_shards,
           m->num_shards == 1 ? "" : "s", file_bytes / 1048576.0);
    printf("  stored: %s %d px, %d channel%s; height %d..%d (mean %.1f), width %d..%d (mean %.1f)\n",
           m->layout == SHARD_LAYOUT_SQUARE ? "square" : "shorter side", m->image_size,
           m->channels, m->channels > 1 ? "s" : "", hmin, hmax, hsum / N, wmin, wmax, wsum / N);
    double raw = hsum / N * (wsum / N) * m->channels;
    printf("  compressed: %.0f bytes per image (%.2fx smaller than raw pixels)\n",
           (double)stored / N, stored ? raw * N / stored : 0.0);
    printf("  mean");
    for (int c = 0; c < m->channels; c++) printf(" %.4f", m->mean[c]);
    printf("  std");
    for (int c = 0; c < m->channels; c++) printf(" %.4f", m->std[c]);
    printf("  (of pixel / 255)\n  per class:\n");
    for (int k = 0; k < m->num_classes; k++)
        if (k < 50 || k == m->num_classes - 1)
            printf("    %4d %-24s %9llu\n", k, m->class_names[k], (unsigned long long)per[k]);
        else if (k == 50)
            printf("    ... (%d more classes)\n", m->num_classes - 51);
    char *path = cg_malloc(strlen(dir) + strlen(split) + (sheet ? strlen(sheet) : 0) + 32);
    if (sheet) strcpy(path, sheet);
    else sprintf(path, "%s/%s.contact.png", dir, split);
    write_sheet(&d, path, per_class);
    free(path);
    free(per);
    dataset_close(&d);
}

int data_inspect_main(int argc, char **argv) {
    const char *dir = NULL, *split = NULL, *sheet = NULL;
    int per_class = 8;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--split") && i + 1 < argc) split = argv[++i];
        else if (!strcmp(argv[i], "--sheet") && i + 1 < argc) sheet = argv[++i];
        else if (!strcmp(argv[i], "--per-class") && i + 1 < argc) per_class = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !dir) dir = argv[i];
        else CG_FAIL("cgspn data inspect DIR [--split NAME] [--sheet FILE.png] [--per-class K]",
                     "data inspect: unexpected argument '%s'", argv[i]);
    }
    CG_CHECK(dir, "cgspn data inspect DIR", "data inspect needs the shard folder");
    CG_CHECK(per_class >= 1 && per_class <= 64, "--per-class 1..64", "--per-class %d", per_class);
    char names[256][64];
    int ns = split ? 1 : dataset_list_splits(dir, names, 256);
    if (split) snprintf(names[0], sizeof names[0], "%s", split);
    CG_CHECK(ns > 0, "build shards with cgspn data build", "%s: no *%s files", dir, MANIFEST_EXT);
    CG_CHECK(!sheet || ns == 1, "pass --split too", "--sheet names one file; %s has %d splits",
             dir, ns);
    for (int k = 0; k < ns; k++) inspect_split(dir, names[k], sheet, per_class);
    return 0;
}
