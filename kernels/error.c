#include "error.h"
#include <stdarg.h>

static _Thread_local CgTrap *cg_trap;
static char cg_tag[64];

void cg_error_set_tag(const char *tag) { snprintf(cg_tag, sizeof cg_tag, "%s", tag ? tag : ""); }

CgTrap *cg_trap_set(CgTrap *trap) {
    CgTrap *previous = cg_trap;
    cg_trap = trap;
    return previous;
}

void cg_fail(const char *file, int line, const char *hint, const char *fmt, ...) {
    if (cg_trap) {
        CgTrap *trap = cg_trap;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(trap->message, sizeof trap->message, fmt, ap);
        va_end(ap);
        const size_t room = sizeof trap->message;
        const size_t used = n < 0 ? 0 : (size_t)n < room ? (size_t)n : room - 1;
        if (hint && hint[0])
            snprintf(trap->message + used, room - used, " (hint: %s)", hint);
        longjmp(trap->env, 1);
    }
    fflush(stdout);
    fprintf(stderr, "cgspn: %s%s", cg_tag, cg_tag[0] ? ": " : "");
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
