// IDX reader: see idx.h.
#include "idx.h"
#include "../kernels/error.h"
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define IDX_CHUNK (64u << 20)   // bytes per gzread call, and the first buffer size


// zlib's message for the last error on g, without the "path: " prefix zlib adds.
static const char *gz_message(gzFile g, const char *path) {
    int code;
    const char *m = gzerror(g, &code);
    if (code == Z_ERRNO) return strerror(errno);
    size_t len = strlen(path);
    if (strncmp(m, path, len) == 0 && strncmp(m + len, ": ", 2) == 0) m += len + 2;
    return m;
}

// Reads up to want bytes; *got is how many came. Returns -1 (message in err) on a read error
// or corrupt gzip data, 0 otherwise (a short count means end of file).
static int read_bytes(gzFile g, const char *path, void *buf, size_t want, size_t *got,
                      char *err, size_t n) {
    *got = 0;
    while (*got < want) {
        size_t ask = want - *got < IDX_CHUNK ? want - *got : IDX_CHUNK;
        int r = gzread(g, (char *)buf + *got, (unsigned)ask);
        if (r < 0) {
            int code;
            gzerror(g, &code);
            if (code == Z_BUF_ERROR) {   // gzip stream cut short: report it as a short file
                gzclearerr(g);
                break;
            }
            if (code == Z_DATA_ERROR)
                return cg_set_error(err, n, "%s: corrupt gzip data (%s); expected a valid .gz or a "
                            "plain IDX file", path, gz_message(g, path));
            return cg_set_error(err, n, "%s: read error: %s", path, gz_message(g, path));
        }
        if (r == 0) break;
        *got += (size_t)r;
    }
    return 0;
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint32_t bswap32(uint32_t x) {
    return x >> 24 | (x >> 8 & 0xff00u) | (x << 8 & 0xff0000u) | x << 24;
}

// Reads an IDX file of magic `magic` with `ndim` dims (1 or 3) into dims[] and *data.
static int idx_read(const char *path, uint32_t magic, int ndim, uint32_t *dims, uint8_t **data,
                    char *err, size_t n) {
    const char *kind = ndim == 3 ? "IDX image file" : "IDX label file";
    const size_t header = 4 + 4 * (size_t)ndim;
    *data = NULL;
    errno = 0;
    gzFile g = gzopen(path, "rb");
    if (!g) return cg_set_error(err, n, "%s: cannot open: %s", path, errno ? strerror(errno) : "out of memory");
    gzbuffer(g, 1u << 20);

    uint8_t h[16];
    size_t got;
    uint8_t *buf = NULL;
    int rc = -1;
    if (read_bytes(g, path, h, header, &got, err, n)) goto done;
    if (got == 0) {
        cg_set_error(err, n, "%s: empty file; expected an %s (%zu-byte header, magic 0x%08x, then data)",
             path, kind, header, magic);
        goto done;
    }
    if (got < 4 || be32(h) != magic) {
        uint32_t m = got >= 4 ? be32(h) : 0;
        uint32_t other = magic == IDX_MAGIC_IMAGES ? IDX_MAGIC_LABELS : IDX_MAGIC_IMAGES;
        const char *hint = m == other
            ? (ndim == 3 ? "\n  hint: this is an IDX label file; pass the *-images-idx3-ubyte file"
                         : "\n  hint: this is an IDX image file; pass the *-labels-idx1-ubyte file")
            : m == bswap32(magic) ? "\n  hint: the header is little-endian; IDX is big-endian"
            : "";
        if (got < 4)
            cg_set_error(err, n, "%s: only %zu bytes; expected an %s starting with magic 0x%08x",
                 path, got, kind, magic);
        else
            cg_set_error(err, n, "%s: magic number 0x%08x; expected 0x%08x (%s: uint8 data, %d dim%s)%s",
                 path, m, magic, kind, ndim, ndim == 1 ? "" : "s", hint);
        goto done;
    }
    if (got < header) {
        cg_set_error(err, n, "%s: truncated header: %zu of %zu bytes", path, got, header);
        goto done;
    }
    size_t bytes = 1;
    for (int d = 0; d < ndim; d++) dims[d] = be32(h + 4 + 4 * d);
    for (int d = 0; d < ndim; d++) {
        uint32_t lo = d == 0 ? 0 : 1, hi = d == 0 ? IDX_MAX_COUNT : IDX_MAX_SIDE;
        if (dims[d] < lo || dims[d] > hi) {
            if (ndim == 3)
                cg_set_error(err, n, "%s: header says %u images of %u x %u pixels; expected at most %d "
                     "images of 1..%d x 1..%d pixels (corrupt header?)", path, dims[0], dims[1],
                     dims[2], IDX_MAX_COUNT, IDX_MAX_SIDE, IDX_MAX_SIDE);
            else
                cg_set_error(err, n, "%s: header says %u labels; expected at most %d (corrupt header?)",
                     path, dims[0], IDX_MAX_COUNT);
            goto done;
        }
        bytes *= dims[d];
    }

    // Grow the buffer as data arrives, so a truncated file with a huge header costs little.
    size_t cap = bytes < IDX_CHUNK ? bytes : IDX_CHUNK, have = 0;
    buf = cg_malloc(cap);
    for (;;) {
        if (read_bytes(g, path, buf + have, cap - have, &got, err, n)) goto done;
        have += got;
        if (have < cap || cap == bytes) break;
        cap = cap * 2 < bytes ? cap * 2 : bytes;
        buf = cg_realloc(buf, cap);
    }
    if (have < bytes) {
        if (ndim == 3)
            cg_set_error(err, n, "%s: truncated: %zu of the %zu pixel bytes the header promises "
                 "(%u images of %u x %u) are present", path, have, bytes, dims[0], dims[1], dims[2]);
        else
            cg_set_error(err, n, "%s: truncated: %zu of the %zu labels the header promises are present",
                 path, have, bytes);
        goto done;
    }
    // One byte more: there must be none. Reaching the end also makes zlib check the gzip CRC.
    uint8_t extra;
    if (read_bytes(g, path, &extra, 1, &got, err, n)) goto done;
    if (got) {
        cg_set_error(err, n, "%s: longer than its header says: data continues past the %zu bytes "
             "promised (%u %s); expected the file to end there", path, bytes, dims[0],
             ndim == 3 ? "images" : "labels");
        goto done;
    }
    rc = 0;
done:
    if (g) {
        int zc = gzclose(g);
        if (rc == 0 && zc != Z_OK) rc = cg_set_error(err, n, "%s: gzclose failed (code %d)", path, zc);
    }
    if (rc == 0) *data = buf;
    else free(buf);
    return rc;
}

int idx_load_images(const char *path, IdxImages *out, char *err, size_t n) {
    memset(out, 0, sizeof *out);
    uint32_t dims[3];
    uint8_t *data;
    if (idx_read(path, IDX_MAGIC_IMAGES, 3, dims, &data, err, n)) return -1;
    *out = (IdxImages){.pixels = data, .count = (int)dims[0], .rows = (int)dims[1],
                       .cols = (int)dims[2]};
    return 0;
}

int idx_load_labels(const char *path, IdxLabels *out, char *err, size_t n) {
    memset(out, 0, sizeof *out);
    uint32_t dims[1];
    uint8_t *data;
    if (idx_read(path, IDX_MAGIC_LABELS, 1, dims, &data, err, n)) return -1;
    *out = (IdxLabels){.labels = data, .count = (int)dims[0]};
    return 0;
}

void idx_free_images(IdxImages *im) {
    free(im->pixels);
    memset(im, 0, sizeof *im);
}

void idx_free_labels(IdxLabels *lb) {
    free(lb->labels);
    memset(lb, 0, sizeof *lb);
}

void fmnist_free(FmnistSplit *s) {
    idx_free_images(&s->images);
    idx_free_labels(&s->labels);
}

// dir/name.gz, or dir/name when only that exists.
static void fmnist_path(const char *dir, const char *name, char *out, size_t n) {
    snprintf(out, n, "%s/%s.gz", dir, name);
    if (access(out, F_OK) == 0) return;
    char raw[4096];
    snprintf(raw, sizeof raw, "%s/%s", dir, name);
    if (access(raw, F_OK) == 0) snprintf(out, n, "%s", raw);
}

int fmnist_load(const char *dir, int train, FmnistSplit *out, char *err, size_t n) {
    memset(out, 0, sizeof *out);
    const char *split = train ? "train" : "t10k";
    char name[64], ipath[4096], lpath[4096];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", split);
    fmnist_path(dir, name, ipath, sizeof ipath);
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", split);
    fmnist_path(dir, name, lpath, sizeof lpath);

    for (int k = 0; k < 2; k++) {
        const char *p = k == 0 ? ipath : lpath;
        if (access(p, R_OK) != 0)
            return cg_set_error(err, n, "%s: cannot open: %s\n  hint: install Debian's "
                        "dataset-fashion-mnist (make deps), or pass a folder holding the "
                        "Fashion-MNIST IDX files", p, strerror(errno));
    }
    if (idx_load_images(ipath, &out->images, err, n)) return -1;
    if (idx_load_labels(lpath, &out->labels, err, n)) {
        fmnist_free(out);
        return -1;
    }
    int rc = 0;
    if (out->images.count != out->labels.count)
        rc = cg_set_error(err, n, "%s has %d images but %s has %d labels; expected the same count "
                  "(files from different splits or releases?)", ipath, out->images.count,
                  lpath, out->labels.count);
    else if (out->images.count == 0)
        rc = cg_set_error(err, n, "%s: no images; expected the %s split of Fashion-MNIST", ipath, split);
    for (int i = 0; rc == 0 && i < out->labels.count; i++)
        if (out->labels.labels[i] >= FMNIST_CLASSES)
            rc = cg_set_error(err, n, "%s: label %d at index %d; expected 0..%d (Fashion-MNIST has %d "
                      "classes)", lpath, out->labels.labels[i], i, FMNIST_CLASSES - 1,
                      FMNIST_CLASSES);
    if (rc) fmnist_free(out);
    return rc;
}
