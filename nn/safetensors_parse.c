// The safetensors format (nn/safetensors_parse.h): its dtypes, and the header's JSON parsed and
// its entries validated.
#include "safetensors_parse.h"
#include "../kernels/error.h"
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

// ---- dtypes ---------------------------------------------------------------------------------

static const struct { const char *name; size_t size; } kDTypes[ST_NUM_DTYPES] = {
    [ST_BOOL] = {"BOOL", 1},       [ST_U8] = {"U8", 1},     [ST_I8] = {"I8", 1},
    [ST_F8_E5M2] = {"F8_E5M2", 1}, [ST_F8_E4M3] = {"F8_E4M3", 1},
    [ST_I16] = {"I16", 2},         [ST_U16] = {"U16", 2},   [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},       [ST_I32] = {"I32", 4},   [ST_U32] = {"U32", 4},
    [ST_F32] = {"F32", 4},         [ST_F64] = {"F64", 8},   [ST_I64] = {"I64", 8},
    [ST_U64] = {"U64", 8},
};

size_t st_dtype_size(StDType dt) { return dt < ST_NUM_DTYPES ? kDTypes[dt].size : 0; }
const char *st_dtype_name(StDType dt) { return dt < ST_NUM_DTYPES ? kDTypes[dt].name : "?"; }

int st_dtype_parse(const char *s, StDType *out) {
    for (int i = 0; i < ST_NUM_DTYPES; i++)
        if (strcmp(s, kDTypes[i].name) == 0) {
            *out = (StDType)i;
            return 0;
        }
    return -1;
}


// ---- JSON header parser ---------------------------------------------------------------------
// Just enough JSON for the header: objects, arrays, strings (all escapes), non-negative
// integers where the format wants them; any other value is skipped (and checked) when it sits
// in a field we do not use.

#define JSON_MAX_DEPTH 64

typedef struct Json {
    const char *s, *p, *end;   // header text
    const char *path;
    char *err;
    size_t en;
} Json;

__attribute__((format(printf, 2, 3)))
static int jfail(Json *j, const char *fmt, ...) {
    if (j->err && j->en) {
        size_t off = (size_t)snprintf(j->err, j->en, "%s: header byte %zu: ", j->path,
                                      (size_t)(j->p - j->s));
        if (off < j->en) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(j->err + off, j->en - off, fmt, ap);
            va_end(ap);
        }
        size_t len = strlen(j->err);
        if (len < j->en) snprintf(j->err + len, j->en - len, "%s", HINT_CORRUPT);
    }
    return -1;
}

static void jws(Json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int jexpect(Json *j, char c) {
    jws(j);
    if (j->p >= j->end) return jfail(j, "expected '%c', found the end of the header", c);
    if (*j->p != c) return jfail(j, "expected '%c', found '%c'", c, *j->p);
    j->p++;
    return 0;
}

// Peeks the next non-space character (0 at the end).
static char jpeek(Json *j) {
    jws(j);
    return j->p < j->end ? *j->p : 0;
}

static int hex4(Json *j, unsigned *out) {
    if (j->end - j->p < 4) return jfail(j, "truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = j->p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return jfail(j, "bad \\u escape");
    }
    j->p += 4;
    *out = v;
    return 0;
}

// A string into *out (malloc'd, NUL-terminated, escapes decoded to UTF-8); out may be NULL.
static int jstring(Json *j, char **out) {
    if (jexpect(j, '"')) return -1;
    size_t cap = 16, len = 0;
    char *s = out ? cg_malloc(cap) : NULL;
#define PUT(ch) do { if (s) { if (len + 1 >= cap) s = cg_realloc(s, cap *= 2); s[len] = (char)(ch); } len++; } while (0)
    for (;;) {
        if (j->p >= j->end) {
            free(s);
            return jfail(j, "unterminated string");
        }
        unsigned char c = (unsigned char)*j->p++;
        if (c == '"') break;
        if (c < 0x20) {
            free(s);
            j->p--;
            return jfail(j, "control character 0x%02x inside a string", c);
        }
        if (c != '\\') {
            PUT(c);
            continue;
        }
        if (j->p >= j->end) {
            free(s);
            return jfail(j, "unterminated string");
        }
        char e = *j->p++;
        unsigned cp;
        switch (e) {
        case '"': PUT('"'); break;
        case '\\': PUT('\\'); break;
        case '/': PUT('/'); break;
        case 'b': PUT('\b'); break;
        case 'f': PUT('\f'); break;
        case 'n': PUT('\n'); break;
        case 'r': PUT('\r'); break;
        case 't': PUT('\t'); break;
        case 'u':
            if (hex4(j, &cp)) { free(s); return -1; }
            if (cp >= 0xD800 && cp < 0xDC00) {   // a surrogate pair
                unsigned lo;
                if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u') {
                    free(s);
                    return jfail(j, "unpaired UTF-16 surrogate in \\u escape");
                }
                j->p += 2;
                if (hex4(j, &lo)) { free(s); return -1; }
                if (lo < 0xDC00 || lo >= 0xE000) {
                    free(s);
                    return jfail(j, "unpaired UTF-16 surrogate in \\u escape");
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp < 0xE000) {
                free(s);
                return jfail(j, "unpaired UTF-16 surrogate in \\u escape");
            }
            if (cp < 0x80) {
                PUT(cp);
            } else if (cp < 0x800) {
                PUT(0xC0 | (cp >> 6)); PUT(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                PUT(0xE0 | (cp >> 12)); PUT(0x80 | ((cp >> 6) & 0x3F)); PUT(0x80 | (cp & 0x3F));
            } else {
                PUT(0xF0 | (cp >> 18)); PUT(0x80 | ((cp >> 12) & 0x3F));
                PUT(0x80 | ((cp >> 6) & 0x3F)); PUT(0x80 | (cp & 0x3F));
            }
            break;
        default:
            free(s);
            j->p--;
            return jfail(j, "bad escape '\\%c' in a string", e);
        }
    }
#undef PUT
    if (s) {
        s[len] = 0;
        if (strlen(s) != len) {   // an escaped NUL
            free(s);
            return jfail(j, "NUL character inside a string");
        }
        *out = s;
    }
    return 0;
}

// A non-negative integer (no sign, fraction or exponent) that fits in 64 bits.
static int juint(Json *j, const char *what, uint64_t *out) {
    jws(j);
    const char *start = j->p;
    uint64_t v = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        unsigned d = (unsigned)(*j->p - '0');
        if (v > (UINT64_MAX - d) / 10) return jfail(j, "%s does not fit in 64 bits", what);
        v = v * 10 + d;
        j->p++;
    }
    if (j->p == start) return jfail(j, "%s: expected a non-negative integer", what);
    if (j->p - start > 1 && *start == '0') {
        j->p = start;
        return jfail(j, "%s: leading zeros are not JSON", what);
    }
    if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))
        return jfail(j, "%s: expected an integer", what);
    *out = v;
    return 0;
}

static int jskip(Json *j, int depth);

static int jskip_number(Json *j) {
    const char *start = j->p;
    if (j->p < j->end && *j->p == '-') j->p++;
    size_t digits = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++, digits++;
    if (!digits) {
        j->p = start;
        return jfail(j, "expected a JSON value");
    }
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        digits = 0;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++, digits++;
        if (!digits) return jfail(j, "bad number");
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
        digits = 0;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++, digits++;
        if (!digits) return jfail(j, "bad number");
    }
    return 0;
}

static int jskip_word(Json *j, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n) != 0) return jfail(j, "expected a JSON value");
    j->p += n;
    return 0;
}

// Skips (and checks) one value of any kind.
static int jskip(Json *j, int depth) {
    if (depth > JSON_MAX_DEPTH) return jfail(j, "values nested deeper than %d", JSON_MAX_DEPTH);
    char c = jpeek(j);
    switch (c) {
    case '"': return jstring(j, NULL);
    case '{':
        j->p++;
        if (jpeek(j) == '}') { j->p++; return 0; }
        for (;;) {
            if (jstring(j, NULL) || jexpect(j, ':') || jskip(j, depth + 1)) return -1;
            c = jpeek(j);
            if (c == ',') { j->p++; continue; }
            if (c == '}') { j->p++; return 0; }
            return jfail(j, "expected ',' or '}' in an object");
        }
    case '[':
        j->p++;
        if (jpeek(j) == ']') { j->p++; return 0; }
        for (;;) {
            if (jskip(j, depth + 1)) return -1;
            c = jpeek(j);
            if (c == ',') { j->p++; continue; }
            if (c == ']') { j->p++; return 0; }
            return jfail(j, "expected ',' or ']' in an array");
        }
    case 't': return jskip_word(j, "true");
    case 'f': return jskip_word(j, "false");
    case 'n': return jskip_word(j, "null");
    case 0: return jfail(j, "expected a value, found the end of the header");
    default: return jskip_number(j);
    }
}

// [u, u, ...] into v (at most max), count into *n.
static int juint_array(Json *j, const char *what, uint64_t *v, int max, int *n) {
    if (jexpect(j, '[')) return -1;
    *n = 0;
    if (jpeek(j) == ']') { j->p++; return 0; }
    for (;;) {
        uint64_t x = 0;
        if (juint(j, what, &x)) return -1;
        if (*n == max) return jfail(j, "%s has more than %d entries", what, max);
        v[(*n)++] = x;
        char c = jpeek(j);
        if (c == ',') { j->p++; continue; }
        if (c == ']') { j->p++; return 0; }
        return jfail(j, "%s: expected ',' or ']'", what);
    }
}

// One tensor entry {"dtype": ..., "shape": [...], "data_offsets": [b, e]} into t.
static int jtensor(Json *j, StTensor *t) {
    if (jexpect(j, '{')) return -1;
    bool have_dtype = false, have_shape = false, have_offsets = false;
    char what[512];
    if (jpeek(j) != '}') {
        for (;;) {
            char *key;
            if (jstring(j, &key)) return -1;
            if (jexpect(j, ':')) { free(key); return -1; }
            int rc = 0;
            if (strcmp(key, "dtype") == 0) {
                char *dt;
                if (have_dtype) rc = jfail(j, "tensor '%s': \"dtype\" given twice", t->name);
                else if ((rc = jstring(j, &dt)) == 0) {
                    if (st_dtype_parse(dt, &t->dtype) != 0) {
                        char known[256];
                        size_t off = 0;
                        for (int i = 0; i < ST_NUM_DTYPES && off < sizeof known; i++)
                            off += (size_t)snprintf(known + off, sizeof known - off, "%s%s",
                                                    i ? ", " : "", st_dtype_name((StDType)i));
                        rc = cg_set_error(j->err, j->en, "%s: tensor '%s' has dtype '%s', which this reader "
                                  "does not know (known: %s)", j->path, t->name, dt, known);
                    }
                    free(dt);
                }
                have_dtype = true;
            } else if (strcmp(key, "shape") == 0) {
                uint64_t dims[ST_MAX_DIMS];
                snprintf(what, sizeof what, "tensor '%s': shape", t->name);
                if (have_shape) rc = jfail(j, "tensor '%s': \"shape\" given twice", t->name);
                else if ((rc = juint_array(j, what, dims, ST_MAX_DIMS, &t->ndim)) == 0)
                    for (int i = 0; i < t->ndim && rc == 0; i++) {
                        if (dims[i] > (uint64_t)INT64_MAX) rc = jfail(j, "%s: dimension too large", what);
                        t->shape[i] = (int64_t)dims[i];
                    }
                have_shape = true;
            } else if (strcmp(key, "data_offsets") == 0) {
                uint64_t off[3];
                int n = 0;
                snprintf(what, sizeof what, "tensor '%s': data_offsets", t->name);
                if (have_offsets) rc = jfail(j, "tensor '%s': \"data_offsets\" given twice", t->name);
                else if ((rc = juint_array(j, what, off, 3, &n)) == 0 && n != 2)
                    rc = jfail(j, "%s has %d entries; expected [begin, end]", what, n);
                if (rc == 0) {
                    t->begin = (size_t)off[0];
                    t->end = (size_t)off[1];
                }
                have_offsets = true;
            } else {
                rc = jskip(j, 1);
            }
            free(key);
            if (rc) return -1;
            char c = jpeek(j);
            if (c == ',') { j->p++; continue; }
            if (c == '}') break;
            return jfail(j, "tensor '%s': expected ',' or '}'", t->name);
        }
    }
    j->p++;
    if (!have_dtype || !have_shape || !have_offsets)
        return jfail(j, "tensor '%s' has no \"%s\"", t->name,
                     !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");
    return 0;
}

static int jmetadata(Json *j, StFile *f) {
    if (jexpect(j, '{')) return -1;
    if (jpeek(j) == '}') { j->p++; return 0; }
    for (;;) {
        char *k, *v;
        if (jstring(j, &k)) return -1;
        if (jexpect(j, ':')) { free(k); return -1; }
        if (jpeek(j) != '"') {
            free(k);
            return jfail(j, "__metadata__ values must be strings");
        }
        if (jstring(j, &v)) { free(k); return -1; }
        f->meta_keys = cg_realloc(f->meta_keys, (size_t)(f->n_meta + 1) * sizeof(char *));
        f->meta_values = cg_realloc(f->meta_values, (size_t)(f->n_meta + 1) * sizeof(char *));
        f->meta_keys[f->n_meta] = k;
        f->meta_values[f->n_meta++] = v;
        char c = jpeek(j);
        if (c == ',') { j->p++; continue; }
        if (c == '}') { j->p++; return 0; }
        return jfail(j, "__metadata__: expected ',' or '}'");
    }
}

static int jheader(Json *j, StFile *f) {
    if (jexpect(j, '{')) return -1;
    bool have_meta = false;
    int cap = 0;
    if (jpeek(j) != '}') {
        for (;;) {
            char *key;
            if (jstring(j, &key)) return -1;
            if (jexpect(j, ':')) { free(key); return -1; }
            if (strcmp(key, "__metadata__") == 0) {
                free(key);
                if (have_meta) return jfail(j, "__metadata__ given twice");
                have_meta = true;
                if (jmetadata(j, f)) return -1;
            } else {
                if (f->n == cap) {
                    cap = cap ? 2 * cap : 64;
                    f->tensors = cg_realloc(f->tensors, (size_t)cap * sizeof(StTensor));
                }
                StTensor *t = &f->tensors[f->n++];
                memset(t, 0, sizeof *t);
                t->name = key;
                if (jtensor(j, t)) return -1;
            }
            char c = jpeek(j);
            if (c == ',') { j->p++; continue; }
            if (c == '}') break;
            return jfail(j, "expected ',' or '}' after a header entry");
        }
    }
    j->p++;
    jws(j);
    if (j->p != j->end) return jfail(j, "unexpected characters after the header object");
    return 0;
}

// ---- validation -----------------------------------------------------------------------------

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const StTensor *const *)a)->name, (*(const StTensor *const *)b)->name);
}

static int cmp_begin(const void *a, const void *b) {
    const StTensor *x = *(const StTensor *const *)a, *y = *(const StTensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

const char *st_shape_str(const StTensor *t, char *buf, size_t n) {
    size_t off = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < t->ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (off < n) snprintf(buf + off, n - off, ")");
    return buf;
}

static int validate(StFile *f, char *err, size_t en) {
    char sh[256];
    for (int i = 0; i < f->n; i++) {
        StTensor *t = &f->tensors[i];
        size_t numel = 1;
        bool overflow = false;
        for (int d = 0; d < t->ndim; d++) {
            uint64_t dim = (uint64_t)t->shape[d];
            if (dim && numel > SIZE_MAX / dim) overflow = true;
            else numel *= (size_t)dim;
        }
        size_t es = st_dtype_size(t->dtype);
        if (overflow || numel > SIZE_MAX / es)
            return cg_set_error(err, en, "%s: tensor '%s' has shape %s, too many elements%s", f->path,
                        t->name, st_shape_str(t, sh, sizeof sh), HINT_CORRUPT);
        t->numel = numel;
        if (t->begin > t->end)
            return cg_set_error(err, en, "%s: tensor '%s' has data_offsets [%zu, %zu]: begin after end%s",
                        f->path, t->name, t->begin, t->end, HINT_CORRUPT);
        if (t->end > f->data_size)
            return cg_set_error(err, en, "%s: tensor '%s' has data_offsets [%zu, %zu], past the end of the "
                        "data section (%zu bytes)%s", f->path, t->name, t->begin, t->end,
                        f->data_size, HINT_CORRUPT);
        if (t->end - t->begin != numel * es)
            return cg_set_error(err, en, "%s: tensor '%s' has data_offsets [%zu, %zu] (%zu bytes), but dtype "
                        "%s and shape %s need %zu bytes%s", f->path, t->name, t->begin, t->end,
                        t->end - t->begin, st_dtype_name(t->dtype), st_shape_str(t, sh, sizeof sh),
                        numel * es, HINT_CORRUPT);
    }
    StTensor **order = cg_malloc((size_t)(f->n ? f->n : 1) * sizeof(StTensor *));
    for (int i = 0; i < f->n; i++) order[i] = &f->tensors[i];
    int rc = 0;
    qsort(order, (size_t)f->n, sizeof *order, cmp_name);
    for (int i = 1; i < f->n && rc == 0; i++)
        if (strcmp(order[i]->name, order[i - 1]->name) == 0)
            rc = cg_set_error(err, en, "%s: tensor '%s' appears twice in the header%s", f->path,
                      order[i]->name, HINT_CORRUPT);
    qsort(order, (size_t)f->n, sizeof *order, cmp_begin);
    const StTensor *prev = NULL;   // the non-empty tensor reaching furthest so far
    for (int i = 0; i < f->n && rc == 0; i++) {
        const StTensor *t = order[i];
        if (t->begin == t->end) continue;
        if (prev && t->begin < prev->end)
            rc = cg_set_error(err, en, "%s: tensors '%s' [%zu, %zu) and '%s' [%zu, %zu) overlap%s", f->path,
                      prev->name, prev->begin, prev->end, t->name, t->begin, t->end, HINT_CORRUPT);
        if (!prev || t->end > prev->end) prev = t;
    }
    free(order);
    return rc;
}

int st_parse_header(StFile *f, const char *path, char *err, size_t en) {
    const char *text = (const char *)f->map + 8;
    Json j = {text, text, text + f->header_len, path, err, en};
    return jheader(&j, f) != 0 || validate(f, err, en) != 0 ? -1 : 0;
}
