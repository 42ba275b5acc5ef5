// Manifests and opening a split: see dataset.h.
#include "dataset.h"
#include "shard_format.h"
#include "shard_writer.h"
#include "data_err.h"
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MANIFEST_MAX_SHARDS 1000000

void manifest_path(const char *dir, const char *split, char *out, size_t n) {
    snprintf(out, n, "%s/%s%s", dir, split, MANIFEST_EXT);
}

void manifest_free(Manifest *m) {
    for (int i = 0; m->shard_files && i < m->num_shards; i++) free(m->shard_files[i]);
    for (int i = 0; m->class_names && i < m->num_classes; i++) free(m->class_names[i]);
    free(m->shard_files);
    free(m->shard_images);
    free(m->class_names);
    memset(m, 0, sizeof *m);
}

bool class_lists_differ(char *const *a, int na, const char *a_name, char *const *b, int nb,
                        const char *b_name, char *out, size_t n) {
    int common = na < nb ? na : nb;
    for (int k = 0; k < common; k++)
        if (strcmp(a[k], b[k]) != 0) {
            snprintf(out, n, "class %d is '%s' in %s, '%s' in %s", k, a[k], a_name, b[k], b_name);
            return true;
        }
    if (na != nb) {
        snprintf(out, n, "%d classes in %s, %d in %s (the first %d agree)", na, a_name, nb, b_name,
                 common);
        return true;
    }
    out[0] = 0;
    return false;
}

void manifest_set_stats(Manifest *m, const double *sum, const double *sumsq, uint64_t pixels) {
    for (int c = 0; c < 3; c++) {
        double mean = pixels ? sum[c] / pixels : 0, var = pixels ? sumsq[c] / pixels - mean * mean : 0;
        m->mean[c] = mean;
        m->std[c] = var > 0 ? sqrt(var) : 0;
    }
}

static const char *layout_name(int layout) {
    return layout == SHARD_LAYOUT_SQUARE ? "square" : "shorter";
}

int manifest_write(const Manifest *m, const char *dir, char *err, size_t n) {
    char path[4096], tmp[4200];
    manifest_path(dir, m->split, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return data_fail(err, n, "%s: cannot create: %s", tmp, strerror(errno));
    fprintf(f, "%s %d\nsplit %s\nimages %llu\nchannels %d\nsize %d\nlayout %s\nclasses %d\n",
            MANIFEST_MAGIC, MANIFEST_VERSION, m->split, (unsigned long long)m->images,
            m->channels, m->image_size, layout_name(m->layout), m->num_classes);
    fprintf(f, "mean");
    for (int c = 0; c < m->channels; c++) fprintf(f, " %.9g", m->mean[c]);
    fprintf(f, "\nstd");
    for (int c = 0; c < m->channels; c++) fprintf(f, " %.9g", m->std[c]);
    fprintf(f, "\nshards %d\n", m->num_shards);
    for (int i = 0; i < m->num_shards; i++)
        fprintf(f, "shard %s %llu\n", m->shard_files[i], (unsigned long long)m->shard_images[i]);
    for (int k = 0; k < m->num_classes; k++) fprintf(f, "class %s\n", m->class_names[k]);
    int bad = fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0;
    int e = errno;
    if (fclose(f) != 0 && !bad) bad = 1, e = errno;
    if (bad || rename(tmp, path) != 0) {
        if (!bad) e = errno;
        unlink(tmp);
        return data_fail(err, n, "%s: write failed: %s", path, strerror(e));
    }
    fsync_dir(path);
    return 0;
}

// Parses "N" as an unsigned count in [lo, hi].
static int parse_count(const char *v, uint64_t lo, uint64_t hi, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || v[0] == '-' || x < lo || x > hi) return -1;
    *out = x;
    return 0;
}

int manifest_read(Manifest *m, const char *path, char *err, size_t n) {
    memset(m, 0, sizeof *m);
    FILE *f = fopen(path, "r");
    if (!f)
        return data_fail(err, n, "%s: cannot open: %s%s", path, strerror(errno),
                         errno == ENOENT ? "\n  hint: build the shards with cgspn data build "
                         "(a build that did not finish writes no manifest)" : "");
    char line[1024];
    int lineno = 0, shards_seen = 0, classes_seen = 0, rc = -1;
    int have_images = 0, have_ch = 0, have_size = 0, have_layout = 0, have_mean = 0, have_std = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\n') line[--len] = '\0';
        else if (!feof(f)) {
            data_fail(err, n, "%s:%d: line longer than %zu bytes", path, lineno, sizeof line - 2);
            goto done;
        }
        char *sp = strchr(line, ' ');
        const char *key = line, *val = sp ? sp + 1 : "";
        if (sp) *sp = '\0';
        uint64_t x = 0;
        if (lineno == 1) {
            if (strcmp(key, MANIFEST_MAGIC) != 0) {
                data_fail(err, n, "%s: not a cgspn shard manifest (first line should be '%s %d')",
                          path, MANIFEST_MAGIC, MANIFEST_VERSION);
                goto done;
            }
            if (parse_count(val, 1, 1000, &x) || x != MANIFEST_VERSION) {
                data_fail(err, n, "%s: manifest version '%s'; this cgspn reads %d", path, val,
                          MANIFEST_VERSION);
                goto done;
            }
            continue;
        }
        int bad = 0;
        if (strcmp(key, "split") == 0) {
            bad = strlen(val) == 0 || strlen(val) >= sizeof m->split;
            if (!bad) snprintf(m->split, sizeof m->split, "%s", val);
        } else if (strcmp(key, "images") == 0) {
            bad = parse_count(val, 0, SHARD_MAX_RECORDS * MANIFEST_MAX_SHARDS, &m->images);
            have_images = 1;
        } else if (strcmp(key, "channels") == 0) {
            bad = parse_count(val, 1, 3, &x) || x == 2;
            m->channels = (int)x, have_ch = 1;
        } else if (strcmp(key, "size") == 0) {
            bad = parse_count(val, 1, SHARD_MAX_SIDE, &x);
            m->image_size = (int)x, have_size = 1;
        } else if (strcmp(key, "layout") == 0) {
            bad = strcmp(val, "square") != 0 && strcmp(val, "shorter") != 0;
            m->layout = strcmp(val, "square") == 0 ? SHARD_LAYOUT_SQUARE : SHARD_LAYOUT_SHORTER;
            have_layout = 1;
        } else if (strcmp(key, "classes") == 0) {
            bad = m->class_names || parse_count(val, 1, SHARD_MAX_CLASSES, &x);
            if (!bad) {
                m->num_classes = (int)x;
                m->class_names = calloc(x, sizeof(char *));
                bad = !m->class_names;
            }
        } else if (strcmp(key, "mean") == 0 || strcmp(key, "std") == 0) {
            double *dst = key[0] == 'm' ? m->mean : m->std;
            char *p = (char *)val, *end;
            int k = 0;
            for (; k < 3 && *p; k++) {
                dst[k] = strtod(p, &end);
                if (end == p || !isfinite(dst[k])) { bad = 1; break; }
                p = end + (*end == ' ');
            }
            bad = bad || *p || k == 0;
            if (key[0] == 'm') have_mean = k; else have_std = k;
        } else if (strcmp(key, "shards") == 0) {
            bad = m->shard_files || parse_count(val, 1, MANIFEST_MAX_SHARDS, &x);
            if (!bad) {
                m->num_shards = (int)x;
                m->shard_files = calloc(x, sizeof(char *));
                m->shard_images = calloc(x, sizeof(uint64_t));
                bad = !m->shard_files || !m->shard_images;
            }
        } else if (strcmp(key, "shard") == 0) {
            char *sp2 = strrchr(val, ' ');
            bad = !m->shard_files || shards_seen >= m->num_shards || !sp2 || sp2 == val ||
                  strchr(val, '/') != NULL;
            if (!bad) {
                *sp2 = '\0';
                bad = parse_count(sp2 + 1, 0, SHARD_MAX_RECORDS, &m->shard_images[shards_seen]);
                m->shard_files[shards_seen++] = strdup(val);
            }
        } else if (strcmp(key, "class") == 0) {
            bad = !m->class_names || classes_seen >= m->num_classes ||
                  strlen(val) > SHARD_MAX_CLASS_NAME;
            if (!bad) m->class_names[classes_seen++] = strdup(val);
        } else {
            data_fail(err, n, "%s:%d: unknown manifest key '%s'", path, lineno, key);
            goto done;
        }
        if (bad) {
            data_fail(err, n, "%s:%d: bad value '%s' for '%s'", path, lineno, val, key);
            goto done;
        }
    }
    if (lineno == 0) {
        data_fail(err, n, "%s: empty file; expected a cgspn shard manifest", path);
        goto done;
    }
    if (!m->split[0] || !have_images || !have_ch || !have_size || !have_layout ||
        !m->class_names || !m->shard_files || have_mean != m->channels ||
        have_std != m->channels || shards_seen != m->num_shards ||
        classes_seen != m->num_classes) {
        data_fail(err, n, "%s: incomplete manifest (%d of %d shard lines, %d of %d class lines, "
                  "mean/std with %d/%d of %d channels)", path, shards_seen, m->num_shards,
                  classes_seen, m->num_classes, have_mean, have_std, m->channels);
        goto done;
    }
    uint64_t total = 0;
    for (int i = 0; i < m->num_shards; i++) total += m->shard_images[i];
    if (total != m->images) {
        data_fail(err, n, "%s: the shard lines add up to %llu images; the manifest says %llu",
                  path, (unsigned long long)total, (unsigned long long)m->images);
        goto done;
    }
    rc = 0;
done:
    fclose(f);
    if (rc) {
        // manifest_free needs counts that match the arrays: they do (calloc'd, NULL-padded).
        manifest_free(m);
    }
    return rc;
}

void dataset_close(Dataset *d) {
    for (int i = 0; d->shards && i < d->m.num_shards; i++) shard_close(&d->shards[i]);
    free(d->shards);
    free(d->first);
    free(d->dir);
    manifest_free(&d->m);
    memset(d, 0, sizeof *d);
}

int dataset_open(Dataset *d, const char *dir, const char *split, char *err, size_t n) {
    memset(d, 0, sizeof *d);
    char path[4096];
    manifest_path(dir, split, path, sizeof path);
    if (manifest_read(&d->m, path, err, n)) return -1;
    Manifest *m = &d->m;
    d->dir = strdup(dir);
    d->shards = calloc((size_t)m->num_shards, sizeof(Shard));
    d->first = calloc((size_t)m->num_shards + 1, sizeof(uint64_t));
    if (!d->dir || !d->shards || !d->first) {
        dataset_close(d);
        return data_fail(err, n, "%s: out of memory", path);
    }
    for (int i = 0; i < m->num_shards; i++) {
        char sp[8192];
        snprintf(sp, sizeof sp, "%s/%s", dir, m->shard_files[i]);
        Shard *s = &d->shards[i];
        if (shard_open(s, sp, err, n)) {
            dataset_close(d);
            return -1;
        }
        const char *what = NULL;
        if (s->num_records != m->shard_images[i]) what = "image count";
        else if (s->channels != m->channels) what = "channels";
        else if (s->image_size != m->image_size || s->layout != m->layout) what = "size or layout";
        else if (s->num_classes != m->num_classes) what = "class count";
        for (int k = 0; !what && k < m->num_classes; k++)
            if (strcmp(s->class_names[k], m->class_names[k]) != 0) what = "class names";
        if (what) {
            data_fail(err, n, "%s: %s differs from %s (shard: %llu images, %d channels, size %d, "
                      "%d classes; manifest: %llu, %d, %d, %d)\n  hint: the folder mixes files of "
                      "two builds; rebuild it", sp, what, path,
                      (unsigned long long)s->num_records, s->channels, s->image_size,
                      s->num_classes, (unsigned long long)m->shard_images[i], m->channels,
                      m->image_size, m->num_classes);
            dataset_close(d);
            return -1;
        }
        d->first[i + 1] = d->first[i] + s->num_records;
    }
    return 0;
}

void dataset_locate(const Dataset *d, uint64_t i, int *shard, uint64_t *record) {
    int lo = 0, hi = d->m.num_shards - 1;   // the last shard whose first <= i
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (d->first[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    *shard = lo;
    *record = i - d->first[lo];
}

static int cmp_name(const void *a, const void *b) { return strcmp(a, b); }

int dataset_list_splits(const char *dir, char names[][64], int max) {
    DIR *dp = opendir(dir);
    if (!dp) return 0;
    int k = 0;
    struct dirent *e;
    size_t ext = strlen(MANIFEST_EXT);
    while ((e = readdir(dp)) && k < max) {
        size_t len = strlen(e->d_name);
        if (len > ext && len - ext < 64 && strcmp(e->d_name + len - ext, MANIFEST_EXT) == 0) {
            memcpy(names[k], e->d_name, len - ext);
            names[k][len - ext] = '\0';
            k++;
        }
    }
    closedir(dp);
    qsort(names, (size_t)k, 64, cmp_name);
    return k;
}
