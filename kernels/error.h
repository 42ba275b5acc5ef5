// Errors a user can act on: every library and file call goes through these.
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <setjmp.h>

#ifdef __cplusplus
extern "C" {
#endif

// Prints "cgspn: <message>" and "  hint: <hint>" (when hint is non-empty), then exits 1.
void cg_fail(const char *file, int line, const char *hint, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));

// Library use (kernels/cgspn_abi.c): a thread that installs a trap gets a longjmp to trap->env
// with the message in trap->message instead of the process exiting. Only for code that holds
// no locks and whose frames can be abandoned (memory they allocated leaks).
typedef struct CgTrap {
    jmp_buf env;
    char message[512];
} CgTrap;
// Installs trap for the calling thread (NULL removes it); returns the one it replaces.
CgTrap *cg_trap_set(CgTrap *trap);

// A prefix for every message of this process ("rank 3/8"; "" for none), so that the errors of a
// multi-process run say which process stopped (app/main.c sets it).
void cg_error_set_tag(const char *tag);

#define CG_FAIL(hint, ...) cg_fail(__FILE__, __LINE__, hint, __VA_ARGS__)

// Checks a user-facing condition (never compiled out, unlike assert).
#define CG_CHECK(cond, hint, ...) do { if (!(cond)) CG_FAIL(hint, __VA_ARGS__); } while (0)

// Checks a libc call that returns NULL / nonzero on failure and sets errno.
#define CG_CHECK_ERRNO(cond, what) \
    do { if (!(cond)) CG_FAIL("", "%s: %s", what, strerror(errno)); } while (0)

// For the *_err variants of loaders (tests check messages without exiting): writes the
// message into err (when err is non-NULL) and returns -1.
int cg_set_error(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

void *cg_malloc(size_t bytes);                 // exits with a message on failure
void *cg_calloc(size_t n, size_t size);
void *cg_realloc(void *p, size_t bytes);
char *cg_strdup(const char *s);

#ifdef __cplusplus
}
#endif
