// The safetensors format itself (nn/safetensors.h describes the layout): its dtypes, what a
// parsed header holds, and the parser that validates a header against its data section. The
// reader (nn/safetensors.c) and the writer (nn/safetensors_write.c) stand on it.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "nn/safetensors*.c read and write little-endian data as host memory"
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u * 1000u * 1000u)   // the reference's limit on N

typedef enum {
    ST_BOOL, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_I16, ST_U16, ST_F16, ST_BF16,
    ST_I32, ST_U32, ST_F32, ST_F64, ST_I64, ST_U64, ST_NUM_DTYPES
} StDType;

size_t st_dtype_size(StDType dt);          // bytes per element
const char *st_dtype_name(StDType dt);     // "F32", "BF16", ...
// The dtype named s (exact, upper case) into *out; -1 when s is not one.
int st_dtype_parse(const char *s, StDType *out);

typedef struct StMeta { const char *key, *value; } StMeta;

typedef struct StTensor {
    char *name;
    StDType dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t numel;
    size_t begin, end;     // byte offsets in the data section
} StTensor;

typedef struct StFile {
    char *path;
    uint8_t *map;          // the whole file (mmap), or NULL for an empty data section
    size_t file_size;
    size_t header_len;     // N
    const uint8_t *data;   // map + 8 + N
    size_t data_size;
    StTensor *tensors;     // in file order (header order)
    int n;
    char **meta_keys, **meta_values;
    int n_meta;
} StFile;

// "(2, 3)"
const char *st_shape_str(const StTensor *t, char *buf, size_t n);

#define HINT_CORRUPT "\n  hint: the file is truncated, corrupt or not a safetensors file"

// Parses the header (the header_len bytes of JSON after the 8-byte length at f->map) into f's
// tensors and metadata, then validates them against the data section (f->data_size): dtypes,
// shapes, data_offsets, duplicate names, overlaps. 0, or -1 with a message naming path in err;
// on error f holds what was parsed, for st_close to free.
int st_parse_header(StFile *f, const char *path, char *err, size_t en);

#ifdef __cplusplus
}
#endif
