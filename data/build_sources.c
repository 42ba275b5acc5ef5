// Build sources: an ImageFolder tree and MNIST-style IDX files (see build.h).
#include "build.h"
#include "idx.h"
#include "data_err.h"
#include "../kernels/error.h"
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

typedef struct FolderCtx {
    char **paths;
    int *labels;
    uint64_t count, cap;
} FolderCtx;

typedef struct IdxCtx { FmnistSplit split; } IdxCtx;

static const char *const kFashionClasses[FMNIST_CLASSES] = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
};

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_image_name(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot && (!strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg") || !strcasecmp(dot, ".png"));
}

// Sorted entry names of dir (without . and ..); NULL when it cannot be read.
static char **list_dir(const char *dir, int *count) {
    DIR *d = opendir(dir);
    *count = 0;
    if (!d) return NULL;
    int cap = 64;
    char **names = cg_malloc(sizeof(char *) * cap);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;   // ., .., hidden files
        if (*count == cap) names = cg_realloc(names, sizeof(char *) * (cap *= 2));
        names[(*count)++] = cg_strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)*count, sizeof(char *), cmp_str);
    return names;
}

static void free_names(char **names, int count) {
    for (int i = 0; i < count; i++) free(names[i]);
    free(names);
}

static void add_file(FolderCtx *f, const char *path, int label) {
    if (f->count == f->cap) {
        f->cap = f->cap ? 2 * f->cap : 1024;
        f->paths = cg_realloc(f->paths, sizeof(char *) * f->cap);
        f->labels = cg_realloc(f->labels, sizeof(int) * f->cap);
    }
    f->paths[f->count] = cg_strdup(path);
    f->labels[f->count++] = label;
}

// Every image file under dir (following links), in sorted order per folder level.
static void walk(FolderCtx *f, const char *dir, int label, uint64_t *ignored, int depth) {
    int cnt;
    char **names = list_dir(dir, &cnt);
    if (!names || depth > 32) {
        free_names(names, cnt);
        return;
    }
    for (int i = 0; i < cnt; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat st;
        if (stat(path, &st) != 0) {
            if (is_image_name(names[i])) add_file(f, path, label);   // reported when read
            else (*ignored)++;
        } else if (S_ISDIR(st.st_mode)) {
            walk(f, path, label, ignored, depth + 1);
        } else if (is_image_name(names[i])) {
            add_file(f, path, label);
        } else {
            (*ignored)++;
        }
    }
    free_names(names, cnt);
}

static int folder_get(void *ctx, uint64_t i, int channels, int min_side, Image *im, int *label,
                      int *warning, char *err, size_t n) {
    FolderCtx *f = ctx;
    *label = f->labels[i];
    return image_read_file(f->paths[i], channels, min_side, im, warning, err, n);
}

static const char *folder_name(void *ctx, uint64_t i) { return ((FolderCtx *)ctx)->paths[i]; }

int build_source_imagefolder(BuildSource *src, const char *root, char *err, size_t n) {
    memset(src, 0, sizeof *src);
    struct stat st;
    if (stat(root, &st) != 0)
        return data_fail(err, n, "%s: cannot read the ImageFolder root: %s", root, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return data_fail(err, n, "%s: not a folder; expected ROOT/CLASS/*.jpg (ImageFolder)", root);
    int cnt;
    char **names = list_dir(root, &cnt);
    if (!names) return data_fail(err, n, "%s: cannot list: %s", root, strerror(errno));
    FolderCtx *f = cg_calloc(1, sizeof *f);
    char **classes = cg_malloc(sizeof(char *) * (cnt ? cnt : 1));
    int k = 0;
    for (int i = 0; i < cnt; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", root, names[i]);
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
            classes[k] = cg_strdup(names[i]);
            walk(f, path, k, &src->ignored, 0);
            k++;
        }
    }
    free_names(names, cnt);
    src->ctx = f, src->class_names = classes, src->num_classes = k;
    src->count = f->count, src->get = folder_get, src->name = folder_name;
    if (k == 0 || f->count == 0) {
        build_source_free(src);
        return data_fail(err, n, "%s: %s; expected ROOT/CLASS/*.jpg|png (ImageFolder: one "
                         "subfolder per class)", root, k == 0 ? "no subfolders" : "no .jpg, "
                         ".jpeg or .png files in its subfolders");
    }
    return 0;
}

static int idx_get(void *ctx, uint64_t i, int channels, int min_side, Image *im, int *label,
                   int *warning, char *err, size_t n) {
    const FmnistSplit *s = &((IdxCtx *)ctx)->split;
    size_t hw = (size_t)s->images.rows * s->images.cols;
    im->pixels = cg_malloc(hw * channels);
    im->height = s->images.rows, im->width = s->images.cols, im->channels = channels;
    const uint8_t *p = s->images.pixels + i * hw;
    for (size_t j = 0; j < hw; j++)
        for (int c = 0; c < channels; c++) im->pixels[j * channels + c] = p[j];
    *label = s->labels.labels[i];
    *warning = 0;
    return 0;
}

static const char *idx_name(void *ctx, uint64_t i) { return "IDX image"; }

int build_source_idx(BuildSource *src, const char *dir, const char *split, char *err, size_t n) {
    memset(src, 0, sizeof *src);
    IdxCtx *c = cg_calloc(1, sizeof *c);
    if (fmnist_load(dir, strcmp(split, "train") == 0, &c->split, err, n)) {
        free(c);
        return -1;
    }
    src->ctx = c;
    src->count = (uint64_t)c->split.images.count;
    src->num_classes = FMNIST_CLASSES;
    src->class_names = cg_malloc(sizeof(char *) * FMNIST_CLASSES);
    int fashion = 0;
    for (const char *p = dir; *p && !fashion; p++) fashion = strncasecmp(p, "fashion", 7) == 0;
    for (int k = 0; k < FMNIST_CLASSES; k++) {
        char digit[4];
        snprintf(digit, sizeof digit, "%d", k);
        src->class_names[k] = cg_strdup(fashion ? kFashionClasses[k] : digit);
    }
    src->get = idx_get, src->name = idx_name;
    src->native_size = c->split.images.rows == c->split.images.cols ? c->split.images.rows : 0;
    return 0;
}

void build_source_free(BuildSource *src) {
    if (src->get == folder_get && src->ctx) {
        FolderCtx *f = src->ctx;
        for (uint64_t i = 0; i < f->count; i++) free(f->paths[i]);
        free(f->paths);
        free(f->labels);
        free(f);
    } else if (src->get == idx_get && src->ctx) {
        fmnist_free(&((IdxCtx *)src->ctx)->split);
        free(src->ctx);
    }
    for (int k = 0; src->class_names && k < src->num_classes; k++) free(src->class_names[k]);
    free(src->class_names);
    memset(src, 0, sizeof *src);
}
