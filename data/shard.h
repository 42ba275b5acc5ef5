// Reading one shard file (format: data/shard_format.h, data/README.md). The file is mapped
// read-only; opening checks the header, footer and index (checksums, sizes, every entry's
// bounds), so a record read afterwards only decompresses its own frame. Functions return 0,
// or -1 with a message naming the file (and record) in err; nothing here exits or asserts.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct ZSTD_DCtx_s ZSTD_DCtx;

typedef struct ShardRecord {
    uint64_t offset;       // of the zstd frame in the file
    uint32_t bytes, crc;   // stored (compressed) size and its CRC32
    int height, width;
    int label;
} ShardRecord;

typedef struct Shard {
    char *path;
    const uint8_t *data;   // the whole file
    size_t size;
    int mapped;            // data is an mmap (else borrowed: shard_parse)
    int version, channels, image_size, layout, num_classes, shard_no;
    uint64_t num_records, header_bytes, index_offset;
    double sum[3], sumsq[3];   // of pixel/255 over this shard, per channel
    uint64_t pixels;           // pixels per channel summed
    char **class_names;        // num_classes NUL-terminated names
} Shard;

// Maps path and checks it (shard_parse).
int  shard_open(Shard *s, const char *path, char *err, size_t n);
// Checks size bytes at data (which must outlive s) as a shard named path.
int  shard_parse(Shard *s, const uint8_t *data, size_t size, const char *path, char *err, size_t n);
void shard_close(Shard *s);

// Record i's index entry (i < num_records; checked at open).
ShardRecord shard_record(const Shard *s, uint64_t i);
// Decompresses record i into dst (room for cap bytes; height*width*channels are needed) with
// dctx (one per thread; NULL = a temporary one). zstd checks the frame's content checksum.
int  shard_read_record(const Shard *s, uint64_t i, ZSTD_DCtx *dctx, uint8_t *dst, size_t cap,
                       char *err, size_t n);
// Full check of record i: the CRC32 of its stored bytes against the index, then decompression.
// scratch needs height*width*channels bytes.
int  shard_verify_record(const Shard *s, uint64_t i, ZSTD_DCtx *dctx, uint8_t *scratch,
                         size_t cap, char *err, size_t n);
