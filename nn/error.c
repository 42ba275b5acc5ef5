#include "error.h"
#include <stdarg.h>

void cg_fail(const char *file, int line, const char *hint, const char *fmt, ...) {
    fflush(stdout);
    fprintf(stderr, "cgspn: ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    if (hint && hint[0]) fprintf(stderr, "  hint: %s\n", hint);
    if (getenv("CGSPN_DEBUG")) fprintf(stderr, "  (raised at %s:%d)\n", file, line);
    exit(1);
}

int cg_set_error(char *err, size_t n, const char *fmt, ...) {
    if (err && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void *cg_malloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) cg_fail(__FILE__, __LINE__, "reduce batch_size or model size",
                    "out of host memory allocating %zu bytes", bytes);
    return p;
}

void *cg_calloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) cg_fail(__FILE__, __LINE__, "reduce batch_size or model size",
                    "out of host memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *cg_realloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) cg_fail(__FILE__, __LINE__, "", "out of host memory reallocating %zu bytes", bytes);
    return q;
}

char *cg_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = cg_malloc(n);
    memcpy(d, s, n);
    return d;
}
