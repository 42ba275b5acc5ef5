// Error messages for the data/ readers: functions return 0, or -1 with a message in err.
// The message names the file (and record, where there is one), what is wrong and what was
// expected, with a "\n  hint: " line where one helps. Callers turn it into CG_FAIL.
#pragma once
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

__attribute__((format(printf, 3, 4), unused))
static int data_fail(char *err, size_t n, const char *fmt, ...) {
    if (err && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return -1;
}
