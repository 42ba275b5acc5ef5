// kernels/alloc_count.h: a list of live allocations per kind of device. Allocations are few
// (parameter buffers, arena chunks, workspaces) and long-lived, so a flat list searched from its
// newest end is enough.
#include "alloc_count.h"
#include "error.h"
#include <pthread.h>
#include <stdlib.h>

typedef struct Live { const void *p; size_t bytes; } Live;

typedef struct Count {
    Live *live;
    int n, cap;
    size_t now, peak;
} Count;

static Count counts[2];   // by Device
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

void alloc_count_add(Device dev, const void *p, size_t bytes) {
    pthread_mutex_lock(&lock);
    Count *c = &counts[dev];
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 64;
        Live *grown = realloc(c->live, (size_t)cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&lock);
            CG_FAIL("", "out of host memory counting device allocations");
        }
        c->live = grown;
        c->cap = cap;
    }
    c->live[c->n++] = (Live){p, bytes};
    c->now += bytes;
    if (c->now > c->peak) c->peak = c->now;
    pthread_mutex_unlock(&lock);
}

void alloc_count_remove(Device dev, const void *p) {
    if (!p) return;
    pthread_mutex_lock(&lock);
    Count *c = &counts[dev];
    for (int i = c->n - 1; i >= 0; i--) {
        if (c->live[i].p != p) continue;
        c->now -= c->live[i].bytes;
        c->live[i] = c->live[--c->n];
        break;
    }
    pthread_mutex_unlock(&lock);
}

void alloc_count_get(Device dev, size_t *now, size_t *peak) {
    pthread_mutex_lock(&lock);
    *now = counts[dev].now;
    *peak = counts[dev].peak;
    pthread_mutex_unlock(&lock);
}

void alloc_count_reset_peak(Device dev) {
    pthread_mutex_lock(&lock);
    counts[dev].peak = counts[dev].now;
    pthread_mutex_unlock(&lock);
}
