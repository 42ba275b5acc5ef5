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

// Appends name to a ", "-separated list of at most NOTE_NAMES names in buf (then "...").
#define NOTE_NAMES 5
static void note_name(char *buf, size_t n, int index, const char *name) {
    size_t len = strlen(buf);
    if (index < NOTE_NAMES) snprintf(buf + len, n - len, "%s%s", index ? ", " : "", name);
    else if (index == NOTE_NAMES) snprintf(buf + len, n - len, ", ...");
}

int build_source_imagefolder(BuildSource *src, const char *root, bool skip_empty, char *err,
                             size_t n) {
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
    char empty[256] = "";
    int k = 0, n_empty = 0, n_dirs = 0;
    for (int i = 0; i < cnt; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", root, names[i]);
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
            uint64_t before = f->count;
            n_dirs++;
            walk(f, path, k, &src->ignored, 0);
            if (f->count == before) {   // no images: not a class
                note_name(empty, sizeof empty, n_empty++, names[i]);
                continue;
            }
            classes[k++] = cg_strdup(names[i]);
        }
    }
    free_names(names, cnt);
    src->ctx = f, src->class_names = classes, src->num_classes = k;
    src->count = f->count, src->get = folder_get, src->name = folder_name;
    if (n_empty && !skip_empty) {
        build_source_free(src);
        return data_fail(err, n, "%s: %d class folder%s without images: %s (every subfolder is a "
                         "class, so it would shift the labels of the classes after it); remove "
                         "it, or pass --skip-empty-classes to leave it out", root, n_empty,
                         n_empty == 1 ? "" : "s", empty);
    }
    if (n_empty)
        snprintf(src->note, sizeof src->note, "left out %d empty class folder%s: %s", n_empty,
                 n_empty == 1 ? "" : "s", empty);
    if (k == 0 || f->count == 0) {
        build_source_free(src);
        return data_fail(err, n, "%s: %s; expected ROOT/CLASS/*.jpg|png (ImageFolder: one "
                         "subfolder per class)", root, n_dirs == 0 ? "no subfolders" : "no .jpg, "
                         ".jpeg or .png files in its subfolders");
    }
    return 0;
}

int build_source_use_classes(BuildSource *src, char *const *names, int n, const char *whose,
                             char *err, size_t en) {
    int *map = cg_malloc(sizeof(int) * (size_t)(src->num_classes ? src->num_classes : 1));
    for (int k = 0; k < src->num_classes; k++) {
        map[k] = -1;
        for (int j = 0; j < n && map[k] < 0; j++)
            if (strcmp(src->class_names[k], names[j]) == 0) map[k] = j;
        if (map[k] < 0) {
            data_fail(err, en, "class '%s' is not among the %d classes of %s", src->class_names[k],
                      n, whose);
            free(map);
            return -1;
        }
    }
    bool same = src->num_classes == n;
    for (int k = 0; k < src->num_classes && same; k++) same = map[k] == k;
    if (!same) {
        if (src->get != folder_get) {   // IDX: fixed labels, a fixed list
            free(map);
            return data_fail(err, en, "the source's classes cannot be renumbered to %s's", whose);
        }
        FolderCtx *f = src->ctx;
        for (uint64_t i = 0; i < f->count; i++) f->labels[i] = map[f->labels[i]];
        for (int k = 0; k < src->num_classes; k++) free(src->class_names[k]);
        free(src->class_names);
        src->class_names = cg_malloc(sizeof(char *) * (size_t)n);
        for (int j = 0; j < n; j++) src->class_names[j] = cg_strdup(names[j]);
        src->num_classes = n;
    }
    free(map);
    return 0;
}

// ---- a flat folder and a label file (ImageNet's val/ as distributed) ---------------------------

typedef struct LabelLine {
    char *file, *cls;
} LabelLine;

static int cmp_label_line(const void *a, const void *b) {
    return strcmp(((const LabelLine *)a)->file, ((const LabelLine *)b)->file);
}

// "NAME CLASS", "NAME,CLASS" or Kaggle's "ImageId,PredictionString" row (the class is the first
// word of the prediction string). Returns 0 with the two fields cut in place, -1 when a field is
// missing.
static int split_label_line(char *line, char **file, char **cls) {
    char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    *file = p;
    while (*p && *p != ',' && *p != ' ' && *p != '\t') p++;
    if (!*p) return -1;
    *p++ = '\0';
    while (*p == ' ' || *p == '\t' || *p == ',') p++;
    *cls = p;
    while (*p && *p != ' ' && *p != '\t' && *p != ',' && *p != '\r' && *p != '\n') p++;
    *p = '\0';
    return **file && **cls ? 0 : -1;
}

// dir/name, or dir/name with an image extension (Kaggle's ImageIds have none); NULL if neither.
static char *resolve_image(const char *dir, const char *name) {
    static const char *const exts[] = {"", ".JPEG", ".jpg", ".jpeg", ".png", ".PNG"};
    struct stat st;
    for (size_t e = 0; e < sizeof exts / sizeof exts[0]; e++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%.3000s%s", dir, name, exts[e]);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && is_image_name(path)) return cg_strdup(path);
    }
    return NULL;
}

int build_source_labeled_folder(BuildSource *src, const char *dir, const char *labels, char *err,
                                size_t n) {
    memset(src, 0, sizeof *src);
    FILE *fp = fopen(labels, "r");
    if (!fp) return data_fail(err, n, "%s: cannot read the label file: %s", labels, strerror(errno));
    LabelLine *rows = NULL;
    size_t count = 0, cap = 0;
    char line[8192];
    int lineno = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, fp)) {
        lineno++;
        char *file, *cls, *q = line;
        while (*q == ' ' || *q == '\t') q++;
        if (*q == '\n' || *q == '\r' || *q == '\0' || *q == '#') continue;
        if (lineno == 1 && strncasecmp(q, "ImageId", 7) == 0) continue;   // Kaggle's header
        if (split_label_line(line, &file, &cls) != 0) {
            rc = data_fail(err, n, "%s line %d: expected 'NAME CLASS' (or NAME,CLASS; Kaggle's "
                           "LOC_val_solution.csv rows work too)", labels, lineno);
            break;
        }
        if (count == cap) {
            cap = cap ? 2 * cap : 1024;
            rows = cg_realloc(rows, cap * sizeof *rows);
        }
        rows[count].file = resolve_image(dir, file);
        rows[count].cls = cg_strdup(cls);
        if (!rows[count].file)
            rc = data_fail(err, n, "%s line %d: no image %s/%s (with or without .JPEG, .jpg, .jpeg, "
                           ".png)", labels, lineno, dir, file);
        count++;
    }
    fclose(fp);
    if (rc == 0 && count == 0) rc = data_fail(err, n, "%s: no labeled images", labels);
    // Classes: the label file's class names in sorted order (ImageNet's val names all 1000
    // wnids, so its indices are the train ImageFolder's).
    char **classes = NULL;
    int k = 0;
    if (rc == 0) {
        char **names = cg_malloc(count * sizeof(char *));
        for (size_t i = 0; i < count; i++) names[i] = rows[i].cls;
        qsort(names, count, sizeof(char *), cmp_str);
        classes = cg_malloc(count * sizeof(char *));
        for (size_t i = 0; i < count; i++)
            if (i == 0 || strcmp(names[i], names[i - 1]) != 0) classes[k++] = cg_strdup(names[i]);
        free(names);
        qsort(rows, count, sizeof *rows, cmp_label_line);
        for (size_t i = 1; i < count && rc == 0; i++)
            if (strcmp(rows[i].file, rows[i - 1].file) == 0)
                rc = data_fail(err, n, "%s: %s is labeled twice", labels, rows[i].file);
    }
    FolderCtx *f = cg_calloc(1, sizeof *f);
    for (size_t i = 0; i < count; i++) {
        if (rc == 0) {
            char *const *hit = bsearch(&rows[i].cls, classes, (size_t)k, sizeof(char *), cmp_str);
            add_file(f, rows[i].file, (int)(hit - classes));
        }
        free(rows[i].file);
        free(rows[i].cls);
    }
    free(rows);
    src->ctx = f, src->class_names = classes, src->num_classes = k;
    src->count = f->count, src->get = folder_get, src->name = folder_name;
    if (rc != 0) {
        build_source_free(src);
        return rc;
    }
    // The folder's images the label file does not name: counted and named, not built.
    int cnt;
    char **names = list_dir(dir, &cnt);
    if (names) {
        char missing[256] = "";
        int n_missing = 0;
        for (int i = 0; i < cnt; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            if (!is_image_name(names[i])) continue;
            const char *key = path;
            bool named = false;   // f->paths is in sorted order (rows were sorted by file)
            size_t lo = 0, hi = f->count;
            while (lo < hi && !named) {
                size_t mid = (lo + hi) / 2;
                int c = strcmp(f->paths[mid], key);
                if (c == 0) named = true;
                else if (c < 0) lo = mid + 1;
                else hi = mid;
            }
            if (!named) note_name(missing, sizeof missing, n_missing++, names[i]);
        }
        free_names(names, cnt);
        if (n_missing)
            snprintf(src->note, sizeof src->note, "%d image%s of %s not in %s (not built): %s",
                     n_missing, n_missing == 1 ? "" : "s", dir, labels, missing);
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
