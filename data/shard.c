// Shard reader: see shard.h and shard_format.h.
#include "shard.h"
#include "shard_format.h"
#include "data_err.h"
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#define VERIFY_HINT "\n  hint: the file is damaged; rebuild it with cgspn data build " \
                    "(cgspn data verify DIR checks every record)"

static uint32_t crc_of(const uint8_t *p, size_t n) { return (uint32_t)crc32_z(0, p, n); }

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static int all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

void shard_close(Shard *s) {
    if (s->mapped && s->data) munmap((void *)s->data, s->size);
    if (s->class_names)
        for (int i = 0; i < s->num_classes; i++) free(s->class_names[i]);
    free(s->class_names);
    free(s->path);
    memset(s, 0, sizeof *s);
}

ShardRecord shard_record(const Shard *s, uint64_t i) {
    const uint8_t *e = s->data + s->index_offset + i * SHARD_INDEX_ENTRY;
    return (ShardRecord){le64(e + SI_OFFSET), le32(e + SI_BYTES), le32(e + SI_CRC),
                         le16(e + SI_HEIGHT), le16(e + SI_WIDTH), (int)le32(e + SI_LABEL)};
}

// Header, footer, class names and index, in the order that gives the most useful message.
static int parse(Shard *s, const char *p, char *err, size_t n) {
    const uint8_t *d = s->data;
    size_t size = s->size;
    const size_t min = SHARD_HEADER_FIXED + SHARD_FOOTER_BYTES;
    if (size == 0)
        return data_fail(err, n, "%s: empty file (0 bytes); expected a cgspn shard%s", p,
                         "\n  hint: a build was interrupted or the disk filled; rebuild with "
                         "cgspn data build");
    if (size < min)
        return data_fail(err, n, "%s: only %zu bytes; a cgspn shard has at least %zu (header "
                         "and footer): the file is truncated", p, size, min);
    if (memcmp(d + SH_MAGIC, SHARD_MAGIC, 8) != 0) {
        if (all_zero(d, SHARD_HEADER_FIXED))
            return data_fail(err, n, "%s: blank header: the build that wrote this file did not "
                             "finish\n  hint: rebuild with cgspn data build", p);
        return data_fail(err, n, "%s: not a cgspn shard (magic \"%.8s\" is not \"%s\")", p,
                         (const char *)d, SHARD_MAGIC);
    }
    s->version = (int)le32(d + SH_VERSION);
    if (s->version != (int)SHARD_VERSION)
        return data_fail(err, n, "%s: shard format version %d; this cgspn reads version %u%s", p,
                         s->version, SHARD_VERSION,
                         s->version > (int)SHARD_VERSION ? "\n  hint: written by a newer "
                         "cgspn; update it or rebuild the shards" : "");
    uint32_t class_bytes = le32(d + SH_CLASS_BYTES);
    s->header_bytes = le32(d + SH_HEADER_BYTES);
    if (class_bytes > size || s->header_bytes != ((SHARD_HEADER_FIXED + class_bytes + 7) & ~7ull)
        || s->header_bytes + SHARD_FOOTER_BYTES > size)
        return data_fail(err, n, "%s: header size %llu / class names %u bytes do not fit a %zu-byte "
                         "file (corrupt header)" VERIFY_HINT, p,
                         (unsigned long long)s->header_bytes, class_bytes, size);
    uint32_t hcrc = (uint32_t)crc32_z(0, d, SH_HEADER_CRC);
    hcrc = (uint32_t)crc32_z(hcrc, d + SHARD_HEADER_FIXED, class_bytes);
    if (hcrc != le32(d + SH_HEADER_CRC))
        return data_fail(err, n, "%s: header checksum mismatch (stored 0x%08x, computed 0x%08x)"
                         VERIFY_HINT, p, le32(d + SH_HEADER_CRC), hcrc);

    s->channels = (int)le32(d + SH_CHANNELS);
    s->image_size = (int)le32(d + SH_SIZE);
    s->layout = (int)le32(d + SH_LAYOUT);
    s->num_classes = (int)le32(d + SH_CLASSES);
    s->num_records = le64(d + SH_RECORDS);
    s->index_offset = le64(d + SH_INDEX_OFFSET);
    s->shard_no = (int)le32(d + SH_SHARD_NO);
    for (int c = 0; c < 3; c++) {
        s->sum[c] = le_f64(d + SH_SUM + 8 * c);
        s->sumsq[c] = le_f64(d + SH_SUMSQ + 8 * c);
    }
    s->pixels = le64(d + SH_PIXELS);
    if ((s->channels != 1 && s->channels != 3) || s->image_size < 1 ||
        s->image_size > SHARD_MAX_SIDE || (s->layout != SHARD_LAYOUT_SQUARE &&
        s->layout != SHARD_LAYOUT_SHORTER) || s->num_classes < 1 ||
        s->num_classes > SHARD_MAX_CLASSES || s->num_records > SHARD_MAX_RECORDS)
        return data_fail(err, n, "%s: header says %d channels, size %d, layout %d, %d classes, "
                         "%llu records; expected 1 or 3 channels, size 1..%d, layout 0 or 1, "
                         "1..%d classes (corrupt header)", p, s->channels, s->image_size,
                         s->layout, s->num_classes, (unsigned long long)s->num_records,
                         SHARD_MAX_SIDE, SHARD_MAX_CLASSES);

    // Footer and the file size they imply together: a cut-off file fails here.
    uint64_t expect = s->index_offset + s->num_records * SHARD_INDEX_ENTRY + SHARD_FOOTER_BYTES;
    if (s->index_offset > size) expect = UINT64_MAX;   // no wrap-around below
    if (s->index_offset < s->header_bytes || expect != size)
        return data_fail(err, n, "%s: %zu bytes, but the header describes a %llu-byte file "
                         "(%llu records, index at %llu): the file is %s" VERIFY_HINT, p, size,
                         (unsigned long long)expect, (unsigned long long)s->num_records,
                         (unsigned long long)s->index_offset,
                         expect > size ? "truncated" : "corrupt or has extra bytes");
    const uint8_t *f = d + size - SHARD_FOOTER_BYTES;
    if (memcmp(f + SF_MAGIC, SHARD_FOOTER_MAGIC, 8) != 0 ||
        le32(f + SF_CRC) != crc_of(f, SF_CRC) ||
        le64(f + SF_INDEX_OFFSET) != s->index_offset || le64(f + SF_RECORDS) != s->num_records)
        return data_fail(err, n, "%s: footer missing or inconsistent with the header (the last "
                         "%u bytes should start with \"%s\")" VERIFY_HINT, p,
                         SHARD_FOOTER_BYTES, SHARD_FOOTER_MAGIC);
    uint32_t icrc = crc_of(d + s->index_offset, s->num_records * SHARD_INDEX_ENTRY);
    if (icrc != le32(f + SF_INDEX_CRC))
        return data_fail(err, n, "%s: index checksum mismatch (stored 0x%08x, computed 0x%08x)"
                         VERIFY_HINT, p, le32(f + SF_INDEX_CRC), icrc);

    // Class names: u16 length + bytes each, inside the class block.
    s->class_names = calloc((size_t)s->num_classes, sizeof(char *));
    if (!s->class_names) return data_fail(err, n, "%s: out of memory for %d class names", p,
                                          s->num_classes);
    const uint8_t *c = d + SHARD_HEADER_FIXED, *cend = c + class_bytes;
    for (int k = 0; k < s->num_classes; k++) {
        if (cend - c < 2 || le16(c) > SHARD_MAX_CLASS_NAME || cend - c - 2 < le16(c))
            return data_fail(err, n, "%s: class name %d runs past the class block (corrupt "
                             "header)", p, k);
        size_t len = le16(c);
        s->class_names[k] = malloc(len + 1);
        if (!s->class_names[k]) return data_fail(err, n, "%s: out of memory", p);
        memcpy(s->class_names[k], c + 2, len);
        s->class_names[k][len] = '\0';
        c += 2 + len;
    }

    // Every index entry within the record area, with a sane shape and label.
    for (uint64_t i = 0; i < s->num_records; i++) {
        ShardRecord r = shard_record(s, i);
        int bad_shape = r.height < 1 || r.width < 1 || r.height > SHARD_MAX_SIDE ||
                        r.width > SHARD_MAX_SIDE ||
                        (s->layout == SHARD_LAYOUT_SQUARE
                             ? r.height != s->image_size || r.width != s->image_size
                             : (r.height < r.width ? r.height : r.width) != s->image_size);
        if (r.offset < s->header_bytes || r.bytes == 0 || r.offset > s->index_offset ||
            r.bytes > s->index_offset - r.offset)
            return data_fail(err, n, "%s: record %llu: stored at %llu..%llu, outside the record "
                             "area %llu..%llu (corrupt index)" VERIFY_HINT, p,
                             (unsigned long long)i, (unsigned long long)r.offset,
                             (unsigned long long)(r.offset + r.bytes),
                             (unsigned long long)s->header_bytes,
                             (unsigned long long)s->index_offset);
        if (bad_shape)
            return data_fail(err, n, "%s: record %llu: %d x %d pixels; expected %s %d (corrupt "
                             "index)" VERIFY_HINT, p, (unsigned long long)i, r.height, r.width,
                             s->layout == SHARD_LAYOUT_SQUARE ? "square of side" : "shorter side",
                             s->image_size);
        if (r.label < 0 || r.label >= s->num_classes)
            return data_fail(err, n, "%s: record %llu: label %d; expected 0..%d (corrupt index)"
                             VERIFY_HINT, p, (unsigned long long)i, r.label, s->num_classes - 1);
    }
    return 0;
}

int shard_parse(Shard *s, const uint8_t *data, size_t size, const char *path, char *err,
                size_t n) {
    memset(s, 0, sizeof *s);
    s->data = data;
    s->size = size;
    s->path = dup_str(path);
    if (!s->path) return data_fail(err, n, "%s: out of memory", path);
    if (parse(s, path, err, n)) {
        shard_close(s);
        return -1;
    }
    return 0;
}

int shard_open(Shard *s, const char *path, char *err, size_t n) {
    memset(s, 0, sizeof *s);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return data_fail(err, n, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return data_fail(err, n, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return data_fail(err, n, "%s: not a regular file; expected a shard", path);
    }
    size_t size = (size_t)st.st_size;
    const uint8_t *data = NULL;
    if (size > 0) {
        void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return data_fail(err, n, "%s: cannot map %zu bytes: %s", path, size, strerror(e));
        }
        madvise(m, size, MADV_RANDOM);
        data = m;
    }
    close(fd);
    static const uint8_t empty[1];
    if (shard_parse(s, data ? data : empty, size, path, err, n)) {
        if (data) munmap((void *)data, size);
        return -1;
    }
    s->mapped = data != NULL;
    return 0;
}

static int decompress(const Shard *s, uint64_t i, const ShardRecord *r, ZSTD_DCtx *dctx,
                      uint8_t *dst, size_t cap, char *err, size_t n) {
    size_t want = (size_t)r->height * r->width * s->channels;
    if (cap < want)
        return data_fail(err, n, "%s: record %llu: %d x %d x %d pixels do not fit a %zu-byte "
                         "buffer", s->path, (unsigned long long)i, r->height, r->width,
                         s->channels, cap);
    const uint8_t *src = s->data + r->offset;
    unsigned long long content = ZSTD_getFrameContentSize(src, r->bytes);
    if (content != want)
        return data_fail(err, n, "%s: record %llu (offset %llu): the zstd frame %s %zu pixel "
                         "bytes" VERIFY_HINT, s->path, (unsigned long long)i,
                         (unsigned long long)r->offset,
                         content >= ZSTD_CONTENTSIZE_ERROR ? "is unreadable; expected"
                                                           : "does not hold the", want);
    ZSTD_DCtx *own = dctx ? NULL : ZSTD_createDCtx();
    size_t got = ZSTD_decompressDCtx(dctx ? dctx : own, dst, cap, src, r->bytes);
    ZSTD_freeDCtx(own);
    if (ZSTD_isError(got))
        return data_fail(err, n, "%s: record %llu (offset %llu, label %d): zstd: %s" VERIFY_HINT,
                         s->path, (unsigned long long)i, (unsigned long long)r->offset,
                         r->label, ZSTD_getErrorName(got));
    if (got != want)
        return data_fail(err, n, "%s: record %llu: %zu pixel bytes decoded; expected %zu"
                         VERIFY_HINT, s->path, (unsigned long long)i, got, want);
    return 0;
}

int shard_read_record(const Shard *s, uint64_t i, ZSTD_DCtx *dctx, uint8_t *dst, size_t cap,
                      char *err, size_t n) {
    if (i >= s->num_records)
        return data_fail(err, n, "%s: record %llu requested; the shard has %llu", s->path,
                         (unsigned long long)i, (unsigned long long)s->num_records);
    ShardRecord r = shard_record(s, i);
    return decompress(s, i, &r, dctx, dst, cap, err, n);
}

int shard_verify_record(const Shard *s, uint64_t i, ZSTD_DCtx *dctx, uint8_t *scratch,
                        size_t cap, char *err, size_t n) {
    if (i >= s->num_records)
        return data_fail(err, n, "%s: record %llu requested; the shard has %llu", s->path,
                         (unsigned long long)i, (unsigned long long)s->num_records);
    ShardRecord r = shard_record(s, i);
    uint32_t crc = crc_of(s->data + r.offset, r.bytes);
    if (crc != r.crc)
        return data_fail(err, n, "%s: record %llu (offset %llu, %u bytes, label %d): checksum "
                         "mismatch (stored 0x%08x, computed 0x%08x)" VERIFY_HINT, s->path,
                         (unsigned long long)i, (unsigned long long)r.offset, r.bytes, r.label,
                         r.crc, crc);
    return decompress(s, i, &r, dctx, scratch, cap, err, n);
}
