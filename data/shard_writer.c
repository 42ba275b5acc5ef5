// Shard writer: see shard_writer.h.
#include "shard_writer.h"
#include "shard_format.h"
#include "data_err.h"
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

void pixel_stats(const uint8_t *p, int height, int width, int channels, PixelStats *st) {
    memset(st, 0, sizeof *st);
    size_t hw = (size_t)height * width;
    for (int c = 0; c < channels; c++) {
        uint64_t s = 0, s2 = 0;
        for (size_t i = 0; i < hw; i++) {
            uint32_t v = p[i * channels + c];
            s += v;
            s2 += v * v;
        }
        st->sum[c] = s / 255.0;
        st->sumsq[c] = s2 / (255.0 * 255.0);
    }
    st->pixels = hw;
}

size_t shard_compress_record(ZSTD_CCtx *cctx, int level, const uint8_t *pixels, size_t bytes,
                             uint8_t **buf, size_t *cap, char *err, size_t n) {
    size_t bound = ZSTD_compressBound(bytes);
    if (*cap < bound) {
        uint8_t *b = realloc(*buf, bound);
        if (!b) {
            data_fail(err, n, "out of memory for a %zu-byte record", bound);
            return 0;
        }
        *buf = b;
        *cap = bound;
    }
    // Every parameter this context uses is set here; ZSTD_compress2 starts a new frame.
    const struct { ZSTD_cParameter p; int v; } params[] = {
        {ZSTD_c_compressionLevel, level}, {ZSTD_c_checksumFlag, 1}, {ZSTD_c_contentSizeFlag, 1}};
    for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
        size_t e = ZSTD_CCtx_setParameter(cctx, params[i].p, params[i].v);
        if (ZSTD_isError(e)) {
            data_fail(err, n, "zstd rejected parameter %d = %d: %s", (int)params[i].p, params[i].v,
                      ZSTD_getErrorName(e));
            return 0;
        }
    }
    size_t r = ZSTD_compress2(cctx, *buf, *cap, pixels, bytes);
    if (ZSTD_isError(r)) {
        data_fail(err, n, "zstd compression failed: %s", ZSTD_getErrorName(r));
        return 0;
    }
    return r;
}

static int write_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

static int pwrite_all(int fd, const void *p, size_t n, off_t off) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = pwrite(fd, b, n, off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        b += w;
        off += w;
        n -= (size_t)w;
    }
    return 0;
}

int fsync_dir(const char *path) {
    char *copy = strdup(path);
    if (!copy) return -1;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(copy);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

int shard_writer_open(ShardWriter *w, const char *path, const ShardInfo *info, char *err,
                      size_t n) {
    memset(w, 0, sizeof *w);
    w->fd = -1;
    if (info->channels != 1 && info->channels != 3)
        return data_fail(err, n, "%s: %d channels; shards hold 1 or 3", path, info->channels);
    if (info->num_classes < 1 || info->num_classes > SHARD_MAX_CLASSES)
        return data_fail(err, n, "%s: %d classes; expected 1..%d", path, info->num_classes,
                         SHARD_MAX_CLASSES);
    size_t class_bytes = 0;
    for (int k = 0; k < info->num_classes; k++) {
        size_t len = strlen(info->class_names[k]);
        if (len > SHARD_MAX_CLASS_NAME)
            return data_fail(err, n, "%s: class name '%s' is %zu bytes; the limit is %d", path,
                             info->class_names[k], len, SHARD_MAX_CLASS_NAME);
        class_bytes += 2 + len;
    }
    if (class_bytes > UINT32_MAX - 64)
        return data_fail(err, n, "%s: class names take %zu bytes; too many", path, class_bytes);
    w->info = *info;
    w->class_bytes = class_bytes;
    w->header_bytes = (SHARD_HEADER_FIXED + class_bytes + 7) & ~(size_t)7;
    w->header = calloc(1, w->header_bytes);
    w->path = strdup(path);
    w->tmp_path = malloc(strlen(path) + 5);
    if (!w->header || !w->path || !w->tmp_path) {
        shard_writer_abort(w);
        return data_fail(err, n, "%s: out of memory", path);
    }
    sprintf(w->tmp_path, "%s.tmp", path);
    uint8_t *c = w->header + SHARD_HEADER_FIXED;
    for (int k = 0; k < info->num_classes; k++) {
        size_t len = strlen(info->class_names[k]);
        put16(c, (uint16_t)len);
        memcpy(c + 2, info->class_names[k], len);
        c += 2 + len;
    }
    w->fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int e = errno;
        data_fail(err, n, "%s: cannot create: %s", w->tmp_path, strerror(e));
        shard_writer_abort(w);
        return -1;
    }
    // Blank header now (no magic: readers reject it), the real one in finish.
    uint8_t *blank = calloc(1, w->header_bytes);
    int rc = blank ? write_all(w->fd, blank, w->header_bytes) : -1;
    free(blank);
    if (rc) {
        data_fail(err, n, "%s: write failed: %s", w->tmp_path, strerror(errno));
        shard_writer_abort(w);
        return -1;
    }
    w->pos = w->header_bytes;
    return 0;
}

int shard_writer_add(ShardWriter *w, const uint8_t *frame, size_t bytes, int height, int width,
                     int label, const PixelStats *st, char *err, size_t n) {
    if (height < 1 || width < 1 || height > SHARD_MAX_SIDE || width > SHARD_MAX_SIDE)
        return data_fail(err, n, "%s: record %llu is %d x %d; expected sides 1..%d", w->path,
                         (unsigned long long)w->records, height, width, SHARD_MAX_SIDE);
    if (label < 0 || label >= w->info.num_classes)
        return data_fail(err, n, "%s: record %llu has label %d; expected 0..%d", w->path,
                         (unsigned long long)w->records, label, w->info.num_classes - 1);
    if (bytes == 0 || bytes > UINT32_MAX)
        return data_fail(err, n, "%s: record %llu: %zu compressed bytes; expected 1..4 GiB",
                         w->path, (unsigned long long)w->records, bytes);
    if (w->records == SHARD_MAX_RECORDS)
        return data_fail(err, n, "%s: more than %llu records in one shard", w->path,
                         SHARD_MAX_RECORDS);
    if (w->records == w->index_cap) {
        uint64_t cap = w->index_cap ? 2 * w->index_cap : 4096;
        uint8_t *ix = realloc(w->index, cap * SHARD_INDEX_ENTRY);
        if (!ix) return data_fail(err, n, "%s: out of memory for the index", w->path);
        w->index = ix;
        w->index_cap = cap;
    }
    if (write_all(w->fd, frame, bytes))
        return data_fail(err, n, "%s: write failed: %s", w->tmp_path, strerror(errno));
    uint8_t *e = w->index + w->records * SHARD_INDEX_ENTRY;
    put64(e + SI_OFFSET, w->pos);
    put32(e + SI_BYTES, (uint32_t)bytes);
    put32(e + SI_CRC, (uint32_t)crc32_z(0, frame, bytes));
    put16(e + SI_HEIGHT, (uint16_t)height);
    put16(e + SI_WIDTH, (uint16_t)width);
    put32(e + SI_LABEL, (uint32_t)label);
    w->pos += bytes;
    w->records++;
    if (st) {
        for (int c = 0; c < 3; c++) w->sum[c] += st->sum[c], w->sumsq[c] += st->sumsq[c];
        w->pixels += st->pixels;
    }
    return 0;
}

uint64_t shard_writer_bytes(const ShardWriter *w) {
    return w->pos + w->records * SHARD_INDEX_ENTRY + SHARD_FOOTER_BYTES;
}

int shard_writer_finish(ShardWriter *w, char *err, size_t n) {
    uint64_t index_offset = w->pos, index_bytes = w->records * SHARD_INDEX_ENTRY;
    uint8_t f[SHARD_FOOTER_BYTES] = {0};
    memcpy(f + SF_MAGIC, SHARD_FOOTER_MAGIC, 8);
    put64(f + SF_INDEX_OFFSET, index_offset);
    put64(f + SF_RECORDS, w->records);
    put32(f + SF_INDEX_CRC, (uint32_t)crc32_z(0, w->index, index_bytes));
    put32(f + SF_CRC, (uint32_t)crc32_z(0, f, SF_CRC));

    uint8_t *h = w->header;
    memcpy(h + SH_MAGIC, SHARD_MAGIC, 8);
    put32(h + SH_VERSION, SHARD_VERSION);
    put32(h + SH_HEADER_BYTES, (uint32_t)w->header_bytes);
    put32(h + SH_CHANNELS, (uint32_t)w->info.channels);
    put32(h + SH_SIZE, (uint32_t)w->info.image_size);
    put32(h + SH_LAYOUT, (uint32_t)w->info.layout);
    put32(h + SH_CLASSES, (uint32_t)w->info.num_classes);
    put64(h + SH_RECORDS, w->records);
    put64(h + SH_INDEX_OFFSET, index_offset);
    put32(h + SH_SHARD_NO, (uint32_t)w->info.shard_no);
    for (int c = 0; c < 3; c++) {
        put_f64(h + SH_SUM + 8 * c, w->sum[c]);
        put_f64(h + SH_SUMSQ + 8 * c, w->sumsq[c]);
    }
    put64(h + SH_PIXELS, w->pixels);
    put32(h + SH_CLASS_BYTES, (uint32_t)w->class_bytes);
    uint32_t hcrc = (uint32_t)crc32_z(0, h, SH_HEADER_CRC);
    hcrc = (uint32_t)crc32_z(hcrc, h + SHARD_HEADER_FIXED, w->class_bytes);
    put32(h + SH_HEADER_CRC, hcrc);

    const char *what = "write";
    if ((index_bytes && write_all(w->fd, w->index, index_bytes)) ||
        write_all(w->fd, f, sizeof f))
        goto fail;
    // Data, index and footer reach the disk before the header that makes the file valid.
    what = "fsync";
    if (fsync(w->fd)) goto fail;
    what = "write";
    if (pwrite_all(w->fd, h, w->header_bytes, 0)) goto fail;
    what = "fsync";
    if (fsync(w->fd)) goto fail;
    what = "close";
    int fd = w->fd;
    w->fd = -1;
    if (close(fd)) goto fail;
    what = "rename";
    if (rename(w->tmp_path, w->path)) goto fail;
    fsync_dir(w->path);
    free(w->tmp_path);
    w->tmp_path = NULL;
    shard_writer_abort(w);   // frees the rest; the .tmp name is gone
    return 0;
fail:;
    int e = errno;
    data_fail(err, n, "%s: %s failed: %s", w->tmp_path, what, strerror(e));
    shard_writer_abort(w);
    return -1;
}

void shard_writer_abort(ShardWriter *w) {
    if (w->fd >= 0) close(w->fd);
    if (w->tmp_path) unlink(w->tmp_path);
    free(w->tmp_path);
    free(w->path);
    free(w->header);
    free(w->index);
    memset(w, 0, sizeof *w);
    w->fd = -1;
}
