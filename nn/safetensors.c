// safetensors reading (nn/safetensors.h): fp16, the file mapped, tensors found and read.
#include "safetensors.h"
#include "../kernels/error.h"
#include "../kernels/tensor.h"
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

// ---- conversions ----------------------------------------------------------------------------

float st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {   // subnormal: man * 2^-24, renormalized
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// ---- reading --------------------------------------------------------------------------------

int st_open_err(StFile *f, const char *path, char *err, size_t en) {
    memset(f, 0, sizeof *f);
    f->path = cg_strdup(path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        st_close(f);
        return cg_set_error(err, en, "%s: %s", path, strerror(e));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        st_close(f);
        return cg_set_error(err, en, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        st_close(f);
        return cg_set_error(err, en, "%s: not a regular file", path);
    }
    f->file_size = (size_t)sb.st_size;
    if (f->file_size < 8) {
        close(fd);
        int rc = cg_set_error(err, en, "%s: the file has %zu bytes; a safetensors file starts with an "
                      "8-byte header length%s", path, f->file_size, HINT_CORRUPT);
        st_close(f);
        return rc;
    }
    void *map = mmap(NULL, f->file_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) {
        st_close(f);
        return cg_set_error(err, en, "%s: mmap: %s", path, strerror(e));
    }
    f->map = map;
    uint64_t n;
    memcpy(&n, f->map, 8);
    if (n > ST_MAX_HEADER || n > f->file_size - 8) {
        if (n > ST_MAX_HEADER)
            cg_set_error(err, en, "%s: the header length is %llu bytes, over the format's limit of %u%s",
                 path, (unsigned long long)n, ST_MAX_HEADER, HINT_CORRUPT);
        else
            cg_set_error(err, en, "%s: the header length is %llu bytes, but only %zu bytes follow the "
                 "8-byte length%s", path, (unsigned long long)n, f->file_size - 8, HINT_CORRUPT);
        st_close(f);
        return -1;
    }
    f->header_len = (size_t)n;
    f->data = f->map + 8 + f->header_len;
    f->data_size = f->file_size - 8 - f->header_len;
    if (st_parse_header(f, path, err, en) != 0) {
        st_close(f);
        return -1;
    }
    return 0;
}

void st_open(StFile *f, const char *path) {
    char err[2048];
    if (st_open_err(f, path, err, sizeof err) != 0) CG_FAIL("", "%s", err);
}

void st_close(StFile *f) {
    if (f->map) munmap(f->map, f->file_size);
    for (int i = 0; i < f->n; i++) free(f->tensors[i].name);
    free(f->tensors);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const StTensor *st_find(const StFile *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *st_meta(const StFile *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

const void *st_data(const StFile *f, const StTensor *t) { return f->data + t->begin; }

int st_read_f32_err(const StFile *f, const StTensor *t, float *out, char *err, size_t en) {
    const uint8_t *src = st_data(f, t);
    switch (t->dtype) {
    case ST_F32:
        memcpy(out, src, t->numel * sizeof(float));
        return 0;
    case ST_BF16:
    case ST_F16:
        for (size_t i = 0; i < t->numel; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            out[i] = t->dtype == ST_BF16 ? bf16_to_f32(h) : st_f16_to_f32(h);
        }
        return 0;
    case ST_F64:
        for (size_t i = 0; i < t->numel; i++) {
            double d;
            memcpy(&d, src + 8 * i, 8);
            out[i] = (float)d;
        }
        return 0;
    default:
        return cg_set_error(err, en, "%s: tensor '%s' has dtype %s; expected a floating-point tensor "
                    "(F32, BF16, F16 or F64)", f->path, t->name, st_dtype_name(t->dtype));
    }
}
