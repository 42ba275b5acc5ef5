// safetensors files (https://github.com/huggingface/safetensors), read and written in C with
// no JSON library. Layout:
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   a JSON object, UTF-8: {"NAME": {"dtype": "F32", "shape": [2, 3],
//             "data_offsets": [BEGIN, END]}, ..., "__metadata__": {"key": "value", ...}}
//   the rest  the data section; tensor NAME is the bytes [BEGIN, END) of it, row-major,
//             little-endian (this code assumes a little-endian host, as x86 and ARM are).
//
// Writing follows the reference implementation: the header is padded with spaces to a multiple
// of 8 bytes, and tensors are laid out by decreasing dtype size, then by name, so every tensor
// starts aligned to its element size. (Any order is valid; readers must not rely on it.)
// Files are written to PATH.tmp, fsync'd, then renamed to PATH.
//
// Reading maps the file (mmap) and checks everything before handing out a tensor: the header
// length against the file size, the JSON syntax, every entry's dtype (known), shape
// (non-negative integers, at most ST_MAX_DIMS) and data_offsets (in range, BEGIN <= END,
// END - BEGIN = numel x element size, no two tensors overlapping), duplicate names, and that
// __metadata__ maps strings to strings. Unknown fields inside a tensor entry are ignored (as the
// reference does); gaps between tensors and trailing bytes are tolerated (the reference rejects
// them; we never write them).
//
// Errors: every *_err function returns 0 or -1 and writes a message naming the file (and the
// tensor, where there is one) into err, with a "\n  hint: " line where one helps.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "safetensors_parse.h"   // the format: dtypes, StTensor, StFile

#ifdef __cplusplus
extern "C" {
#endif

// ---- reading --------------------------------------------------------------------------------
int  st_open_err(StFile *f, const char *path, char *err, size_t n);
void st_open(StFile *f, const char *path);    // exits with the message on error
void st_close(StFile *f);
const StTensor *st_find(const StFile *f, const char *name);
const char *st_meta(const StFile *f, const char *key);   // NULL when absent
// The tensor's raw bytes (end - begin of them) in the mapping; 8-aligned only when the writer
// made it so: copy with memcpy.
const void *st_data(const StFile *f, const StTensor *t);
// Reads a floating-point tensor as fp32 into out (numel floats): F32 as is, BF16, F16 and F64
// converted. Other dtypes are an error naming the tensor.
int  st_read_f32_err(const StFile *f, const StTensor *t, float *out, char *err, size_t n);

// ---- writing --------------------------------------------------------------------------------
typedef struct StWriteTensor {
    const char *name;
    StDType dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;      // host bytes, little-endian; NULL: the fetch callback provides them
} StWriteTensor;

// Copies tensor i's bytes (bytes of them) into buf; returns 0, or -1 with a message in err.
typedef int (*StFetchFn)(void *user, int i, void *buf, size_t bytes, char *err, size_t n);

// Writes n tensors and n_meta metadata pairs (meta may be NULL) to path (through path.tmp,
// fsync'd, renamed). fetch may be NULL when every data pointer is set. On error nothing is left
// at path.tmp and an existing file at path is untouched.
int st_write_err(const char *path, const StWriteTensor *t, int n, const StMeta *meta, int n_meta,
                 StFetchFn fetch, void *user, char *err, size_t en);

// ---- conversions (bf16: f32_to_bf16 / bf16_to_f32 in kernels/tensor.h) ---------------------------
float st_f16_to_f32(uint16_t h);           // IEEE half, subnormals, Inf and NaN included

#ifdef __cplusplus
}
#endif
