// Writing one shard file (format: data/shard_format.h). The file is written as PATH.tmp with
// a blank header; shard_writer_finish appends the index and footer, writes the header, fsyncs
// and renames it to PATH (then fsyncs the folder). A crash at any point leaves at most a .tmp
// file, or a file whose blank header every reader rejects, never a shard that looks complete.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct ZSTD_CCtx_s ZSTD_CCtx;

typedef struct ShardInfo {
    int channels;        // 1 or 3
    int image_size;      // S
    int layout;          // SHARD_LAYOUT_*
    int num_classes;
    const char *const *class_names;
    int shard_no;        // position of this shard in its split
} ShardInfo;

typedef struct ShardWriter {
    char *path, *tmp_path;
    int fd;
    ShardInfo info;
    uint8_t *header;     // SHARD_HEADER_FIXED + class block, padded to 8
    size_t header_bytes, class_bytes;
    uint64_t pos;        // bytes written so far
    uint8_t *index;      // SHARD_INDEX_ENTRY per record
    uint64_t records, index_cap;
    double sum[3], sumsq[3];
    uint64_t pixels;
} ShardWriter;

// Pixel statistics of one image, for the dataset mean/std (of pixel/255, per channel).
typedef struct PixelStats { double sum[3], sumsq[3]; uint64_t pixels; } PixelStats;
void pixel_stats(const uint8_t *pixels, int height, int width, int channels, PixelStats *st);

// Compresses h*w*channels pixels into one zstd frame (content size and checksum on) at
// *buf (grown as needed; *cap its size). Returns the frame's size, 0 on a zstd error (err).
size_t shard_compress_record(ZSTD_CCtx *cctx, int level, const uint8_t *pixels, size_t bytes,
                             uint8_t **buf, size_t *cap, char *err, size_t n);

int  shard_writer_open(ShardWriter *w, const char *path, const ShardInfo *info, char *err,
                       size_t n);
// Appends one compressed record (from shard_compress_record) of an h x w image with label.
int  shard_writer_add(ShardWriter *w, const uint8_t *frame, size_t bytes, int height, int width,
                      int label, const PixelStats *st, char *err, size_t n);
// Bytes the shard will have if finished now.
uint64_t shard_writer_bytes(const ShardWriter *w);
int  shard_writer_finish(ShardWriter *w, char *err, size_t n);
// Closes and removes the .tmp file (after an error, or when nothing was added).
void shard_writer_abort(ShardWriter *w);

// fsync of a folder, after a rename in it. Returns 0 or -1 (errno).
int  fsync_dir(const char *dir);
