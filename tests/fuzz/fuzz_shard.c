// libFuzzer target: the shard reader (header, footer, class names, index, then every record's
// checksum and decompression) and the manifest parser, on arbitrary bytes. Built and run by
// tools/fuzz.sh (clang -fsanitize=fuzzer,address,undefined).
#include "../../data/dataset.h"
#include "../../data/shard.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define FUZZ_MAX_RECORD (4u << 20)   // records needing more scratch are skipped (speed only)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[2048];
    Shard s;
    if (shard_parse(&s, data, size, "fuzz.cgs", err, sizeof err) == 0) {
        uint8_t *buf = NULL;
        for (uint64_t i = 0; i < s.num_records && i < 256; i++) {
            ShardRecord r = shard_record(&s, i);
            size_t need = (size_t)r.height * r.width * s.channels;
            if (need > FUZZ_MAX_RECORD) continue;
            buf = realloc(buf, need);
            shard_verify_record(&s, i, NULL, buf, need, err, sizeof err);
            shard_read_record(&s, i, NULL, buf, need, err, sizeof err);
        }
        free(buf);
        shard_close(&s);
    }
    // The same bytes as a manifest.
    char path[64];
    snprintf(path, sizeof path, "/tmp/cgspn_fuzz_manifest_%d", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(data, 1, size, f);
        fclose(f);
        Manifest m;
        if (manifest_read(&m, path, err, sizeof err) == 0) manifest_free(&m);
        unlink(path);
    }
    return 0;
}
