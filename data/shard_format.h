// The shard file format (data/README.md has the full description). Little-endian throughout.
//
//   [header 128 B][class names][record 0]...[record N-1][index N x 24 B][footer 32 B]
//
// A record is one zstd frame (content size and content checksum on) holding h*w*channels
// uint8 pixels, row-major HWC. The index gives, per record, where its frame is, its stored
// size, the CRC32 (zlib) of the stored bytes, h, w and the label; so record i is one seek.
// The header is written last, over a blank placeholder, and the file is built under a .tmp
// name that is renamed when complete: a file with a valid header and footer is complete.
#pragma once
#include <stdint.h>
#include <string.h>

#define SHARD_MAGIC          "CGSPNSHD"   // 8 bytes, at offset 0
#define SHARD_FOOTER_MAGIC   "CGSPNEND"   // 8 bytes, at the start of the footer
#define SHARD_VERSION        1u
#define SHARD_HEADER_FIXED   128u         // bytes before the class names
#define SHARD_INDEX_ENTRY    24u
#define SHARD_FOOTER_BYTES   32u
#define SHARD_EXT            ".cgs"

// Limits: past these a header or image is corrupt (or absurd), not big.
#define SHARD_MAX_CLASSES    1000000
#define SHARD_MAX_CLASS_NAME 255
#define SHARD_MAX_SIDE       16384        // stored images are resized; S is a few hundred
#define SHARD_MAX_RECORDS    100000000ull

enum { SHARD_LAYOUT_SQUARE = 0,           // every record is S x S (centre region, resized)
       SHARD_LAYOUT_SHORTER = 1 };        // shorter side S, aspect kept (capped, see README)

// Header field offsets.
enum {
    SH_MAGIC = 0, SH_VERSION = 8, SH_HEADER_BYTES = 12, SH_CHANNELS = 16, SH_SIZE = 20,
    SH_LAYOUT = 24, SH_CLASSES = 28, SH_RECORDS = 32, SH_INDEX_OFFSET = 40, SH_SHARD_NO = 48,
    SH_SUM = 56, SH_SUMSQ = 80, SH_PIXELS = 104, SH_CLASS_BYTES = 112, SH_HEADER_CRC = 124,
};
// Index entry field offsets.
enum { SI_OFFSET = 0, SI_BYTES = 8, SI_CRC = 12, SI_HEIGHT = 16, SI_WIDTH = 18, SI_LABEL = 20 };
// Footer field offsets.
enum { SF_MAGIC = 0, SF_INDEX_OFFSET = 8, SF_RECORDS = 16, SF_INDEX_CRC = 24, SF_CRC = 28 };

static inline uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t le64(const uint8_t *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }
static inline double le_f64(const uint8_t *p) {
    uint64_t u = le64(p);
    double d;
    memcpy(&d, &u, 8);
    return d;
}
static inline void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static inline void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static inline void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)v), put32(p + 4, (uint32_t)(v >> 32)); }
static inline void put_f64(uint8_t *p, double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    put64(p, u);
}
