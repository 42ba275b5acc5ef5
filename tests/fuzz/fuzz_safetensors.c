// libFuzzer target: the safetensors reader (nn/safetensors*.c) on arbitrary bytes. Built and run
// by tools/fuzz.sh (clang -fsanitize=fuzzer,address,undefined).
//
// Two entry points per input:
//  - the header parser on the input buffer itself (st_parse_header, what st_open_err runs on its
//    mapping). libFuzzer's buffer is exactly the input's size, so ASan sees a read one byte past
//    the end; an mmap'd file would hide it in the rest of the page. Every tensor the parser
//    accepts is then found by name and read as fp32, which touches exactly [begin, end) of the
//    data section: the validation is what keeps those reads in bounds.
//  - st_open_err on the same bytes as a file, for the framing st_open_err checks before parsing
//    (file size, header length against the format's limit and the file).
#include "../../nn/safetensors.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void parse_buffer(const uint8_t *data, size_t size) {
    char err[2048];
    // st_open_err's framing, so the parser sees what it sees there.
    if (size < 8) return;
    uint64_t n;
    memcpy(&n, data, 8);
    if (n > ST_MAX_HEADER || n > size - 8) return;
    StFile f;
    memset(&f, 0, sizeof f);
    f.path = strdup("fuzz.safetensors");   // st_close frees it; messages name it
    f.map = (uint8_t *)data;               // read only: the parser never writes through map
    f.file_size = size;
    f.header_len = (size_t)n;
    f.data = data + 8 + f.header_len;
    f.data_size = size - 8 - f.header_len;
    if (st_parse_header(&f, f.path, err, sizeof err) == 0) {
        for (int i = 0; i < f.n; i++) {
            const StTensor *t = &f.tensors[i];
            // Names are unique after validation, so the lookup finds this very entry.
            if (st_find(&f, t->name) != t) abort();
            char sh[256];
            st_shape_str(t, sh, sizeof sh);
            float *out = malloc(t->numel ? t->numel * sizeof(float) : 1);
            st_read_f32_err(&f, t, out, err, sizeof err);
            free(out);
        }
        for (int i = 0; i < f.n_meta; i++)
            if (!st_meta(&f, f.meta_keys[i])) abort();
    }
    f.map = NULL;   // not a mapping: keep st_close from munmap'ing libFuzzer's buffer
    st_close(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    parse_buffer(data, size);

    char path[64], err[2048];
    // tmpfs when there is one: a file rewritten per input on ext4 is flushed on truncation.
    snprintf(path, sizeof path, "%s/cgspn_fuzz_st_%d.safetensors",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", (int)getpid());
    FILE *fp = fopen(path, "wb");
    if (fp) {
        fwrite(data, 1, size, fp);
        fclose(fp);
        StFile f;
        if (st_open_err(&f, path, err, sizeof err) == 0) st_close(&f);
        unlink(path);
    }
    return 0;
}
