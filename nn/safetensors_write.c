// safetensors writing (nn/safetensors.h): header, layout, PATH.tmp fsync'd and renamed.
#include "safetensors.h"
#include "../kernels/error.h"
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <unistd.h>

// ---- writing --------------------------------------------------------------------------------

typedef struct Buf { char *p; size_t len, cap; } Buf;

static void buf_put(Buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        while (b->len + n + 1 > b->cap) b->cap = b->cap ? 2 * b->cap : 4096;
        b->p = cg_realloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

__attribute__((format(printf, 2, 3)))
static void buf_printf(Buf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    buf_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void buf_json_string(Buf *b, const char *s) {
    buf_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            buf_put(b, e, 2);
        } else if (c < 0x20) {   // serde_json's escapes, as the reference writes them
            const char *e = c == '\b' ? "\\b" : c == '\f' ? "\\f" : c == '\n' ? "\\n"
                          : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
            if (e) buf_put(b, e, 2);
            else buf_printf(b, "\\u%04x", c);
        } else {
            buf_put(b, (const char *)&c, 1);
        }
    }
    buf_put(b, "\"", 1);
}

static int write_all(int fd, const void *p, size_t n, const char *path, char *err, size_t en) {
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return cg_set_error(err, en, "%s: write: %s", path, strerror(errno));
        }
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

// Layout order: decreasing element size, then name (the reference's order).
typedef struct LayoutKey { size_t size; const char *name; int index; } LayoutKey;

static int cmp_layout(const void *a, const void *b) {
    const LayoutKey *x = a, *y = b;
    if (x->size != y->size) return x->size > y->size ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_key_name(const void *a, const void *b) {
    return strcmp(((const LayoutKey *)a)->name, ((const LayoutKey *)b)->name);
}

static int sync_parent_dir(const char *path) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    int fd = open(dirname(tmp), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

int st_write_err(const char *path, const StWriteTensor *t, int n, const StMeta *meta, int n_meta,
                 StFetchFn fetch, void *user, char *err, size_t en) {
    // Check the tensors, then lay them out.
    for (int i = 0; i < n; i++) {
        if (!t[i].name || !t[i].name[0] || strcmp(t[i].name, "__metadata__") == 0)
            return cg_set_error(err, en, "%s: tensor %d has no usable name", path, i);
        if (t[i].dtype >= ST_NUM_DTYPES || t[i].ndim < 0 || t[i].ndim > ST_MAX_DIMS)
            return cg_set_error(err, en, "%s: tensor '%s': bad dtype or rank", path, t[i].name);
        for (int d = 0; d < t[i].ndim; d++)
            if (t[i].shape[d] < 0) return cg_set_error(err, en, "%s: tensor '%s': negative dimension", path, t[i].name);
        if (!t[i].data && !fetch)
            return cg_set_error(err, en, "%s: tensor '%s' has no data", path, t[i].name);
    }
    LayoutKey *keys = cg_malloc((size_t)(n ? n : 1) * sizeof(LayoutKey));
    for (int i = 0; i < n; i++) keys[i] = (LayoutKey){st_dtype_size(t[i].dtype), t[i].name, i};
    qsort(keys, (size_t)n, sizeof *keys, cmp_key_name);
    for (int i = 1; i < n; i++)
        if (strcmp(keys[i].name, keys[i - 1].name) == 0) {
            int rc = cg_set_error(err, en, "%s: tensor '%s' given twice", path, keys[i].name);
            free(keys);
            return rc;
        }
    qsort(keys, (size_t)n, sizeof *keys, cmp_layout);
    int *order = cg_malloc((size_t)(n ? n : 1) * sizeof(int));
    for (int i = 0; i < n; i++) order[i] = keys[i].index;
    free(keys);

    Buf h = {0};
    buf_put(&h, "{", 1);
    bool first = true;
    if (n_meta > 0) {
        buf_put(&h, "\"__metadata__\":{", 16);
        for (int i = 0; i < n_meta; i++) {
            if (i) buf_put(&h, ",", 1);
            buf_json_string(&h, meta[i].key);
            buf_put(&h, ":", 1);
            buf_json_string(&h, meta[i].value);
        }
        buf_put(&h, "}", 1);
        first = false;
    }
    size_t offset = 0, max_bytes = 0;
    size_t *bytes = cg_malloc((size_t)(n ? n : 1) * sizeof(size_t));
    for (int k = 0; k < n; k++) {
        const StWriteTensor *x = &t[order[k]];
        size_t numel = 1;
        for (int d = 0; d < x->ndim; d++) numel *= (size_t)x->shape[d];
        bytes[k] = numel * st_dtype_size(x->dtype);
        if (bytes[k] > max_bytes && !x->data) max_bytes = bytes[k];
        if (!first) buf_put(&h, ",", 1);
        first = false;
        buf_json_string(&h, x->name);
        buf_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(x->dtype));
        for (int d = 0; d < x->ndim; d++) buf_printf(&h, d ? ",%lld" : "%lld", (long long)x->shape[d]);
        buf_printf(&h, "],\"data_offsets\":[%zu,%zu]}", offset, offset + bytes[k]);
        offset += bytes[k];
    }
    buf_put(&h, "}", 1);
    while (h.len % 8) buf_put(&h, " ", 1);

    char tmp[PATH_MAX];
    int rc = 0;
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        rc = cg_set_error(err, en, "%s: path too long", path);
        goto done;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = cg_set_error(err, en, "%s: %s", tmp, strerror(errno));
        goto done;
    }
    uint64_t hl = h.len;
    void *scratch = max_bytes ? cg_malloc(max_bytes) : NULL;
    rc = write_all(fd, &hl, 8, tmp, err, en);
    if (!rc) rc = write_all(fd, h.p, h.len, tmp, err, en);
    for (int k = 0; k < n && !rc; k++) {
        const void *src = t[order[k]].data;
        if (!src && bytes[k]) {
            rc = fetch(user, order[k], scratch, bytes[k], err, en);
            src = scratch;
        }
        if (!rc && bytes[k]) rc = write_all(fd, src, bytes[k], tmp, err, en);
    }
    free(scratch);
    if (!rc && fsync(fd) != 0) rc = cg_set_error(err, en, "%s: fsync: %s", tmp, strerror(errno));
    if (close(fd) != 0 && !rc) rc = cg_set_error(err, en, "%s: close: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path) != 0) rc = cg_set_error(err, en, "%s: rename to %s: %s", tmp, path, strerror(errno));
    if (rc) unlink(tmp);
    else if (sync_parent_dir(path) != 0) rc = cg_set_error(err, en, "%s: fsync of its folder: %s", path, strerror(errno));
done:
    free(h.p);
    free(bytes);
    free(order);
    return rc;
}
