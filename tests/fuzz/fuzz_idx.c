// libFuzzer target: the IDX reader (data/idx.c: header, dims, data, plain or gzip'd through
// zlib) on arbitrary bytes, as an image file and as a label file. Built and run by
// tools/fuzz.sh.
//
// The reader takes only a path (gzopen), so each input is written to a file of this process.
// A header may promise up to 10^8 x 4096 x 4096 bytes: the reader's buffer grows only as data
// arrives (64 MiB at first), which is what keeps such inputs inside libFuzzer's memory limit.
#include "../../data/idx.h"
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile uint8_t g_sink;   // keeps the reads below from being optimized away

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64], err[2048];
    // tmpfs when there is one: a file rewritten per input on ext4 is flushed on truncation.
    snprintf(path, sizeof path, "%s/cgspn_fuzz_idx_%d",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    fwrite(data, 1, size, f);
    fclose(f);

    // Each gzopen allocates zlib's 3 MiB of buffers, most of an input's time under ASan: a plain
    // input goes to the loader its magic names (images unless labels), a gzip'd one to both.
    bool gz = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
    bool labels = size >= 4 && memcmp(data, "\0\0\x08\x01", 4) == 0;   // IDX_MAGIC_LABELS
    if (gz || !labels) {
        IdxImages im;
        if (idx_load_images(path, &im, err, sizeof err) == 0) {
            // What the loader promises its callers: count x rows x cols bytes, all readable.
            size_t bytes = (size_t)im.count * (size_t)im.rows * (size_t)im.cols;
            for (size_t i = 0; i < bytes; i++) g_sink += im.pixels[i];
            idx_free_images(&im);
        }
    }
    if (gz || labels) {
        IdxLabels lb;
        if (idx_load_labels(path, &lb, err, sizeof err) == 0) {
            for (int i = 0; i < lb.count; i++) g_sink += lb.labels[i];
            idx_free_labels(&lb);
        }
    }
    unlink(path);
    return 0;
}
