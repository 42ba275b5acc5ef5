// What nn/safetensors*.c share (the public header is nn/safetensors.h): the header parser.
#pragma once
#include "safetensors.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "nn/safetensors*.c read and write little-endian data as host memory"
#endif

#define HINT_CORRUPT "\n  hint: the file is truncated, corrupt or not a safetensors file"

// Parses the header (the header_len bytes of JSON after the 8-byte length at f->map) into f's
// tensors and metadata, then validates them against the data section (f->data_size): dtypes,
// shapes, data_offsets, duplicate names, overlaps. 0, or -1 with a message naming path in err;
// on error f holds what was parsed, for st_close to free.
int st_parse_header(StFile *f, const char *path, char *err, size_t en);
