#include "params_io.h"
#include "../kernels/error.h"
#include "resample.h"
#include "../kernels/ops.h"
#include <math.h>
#include <stdarg.h>

#define LIST_SHOWN 8   // names listed in a message before "... and K more"

// Appends printf output to err (after what is there).
__attribute__((format(printf, 3, 4)))
static void append(char *err, size_t n, const char *fmt, ...) {
    size_t len = strlen(err);
    if (len + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + len, n - len, fmt, ap);
    va_end(ap);
}

// The last dotted component of a name is one of timm's token parameters.
static bool is_token_param(const char *name) {
    const char *last = strrchr(name, '.');
    last = last ? last + 1 : name;
    return strcmp(last, "pos_embed") == 0 || strcmp(last, "cls_token") == 0 ||
           strcmp(last, "reg_token") == 0 || strcmp(last, "latent") == 0;   // attn_pool.latent
}

int params_file_shape(const Param *p, int64_t *shape) {
    const Tensor *v = &p->value;
    int pad = is_token_param(p->name) && v->ndim < 3 ? 3 - v->ndim : 0;
    for (int i = 0; i < pad; i++) shape[i] = 1;
    for (int i = 0; i < v->ndim; i++) shape[pad + i] = v->shape[i];
    return pad + v->ndim;
}

bool params_shape_matches(const Tensor *p, const StTensor *f) {
    if (f->numel != p->numel) return false;
    int a = 0, b = 0;   // leading 1s ignored on both sides
    while (a < p->ndim - 1 && p->shape[a] == 1) a++;
    while (b < f->ndim - 1 && f->shape[b] == 1) b++;
    if (p->ndim - a == f->ndim - b) {
        bool same = true;
        for (int i = 0; a + i < p->ndim; i++) same &= (int64_t)p->shape[a + i] == f->shape[b + i];
        if (same) return true;
    }
    // A conv weight (D, C, p, p) and its flattened (D, C*p*p) form (numel already equal).
    return ((p->ndim == 2 && f->ndim == 4) || (p->ndim == 4 && f->ndim == 2)) &&
           f->shape[0] == p->shape[0];
}

static void shape_str(const Tensor *t, char *buf, size_t n) { tensor_shape_str(t, buf, n); }

static void list_add(char ***list, int *count, const char *name) {
    *list = cg_realloc(*list, (size_t)(*count + 1) * sizeof(char *));
    (*list)[(*count)++] = cg_strdup(name);
}

void load_report_free(LoadReport *r) {
    for (int i = 0; i < r->n_missing; i++) free(r->missing[i]);
    for (int i = 0; i < r->n_extra; i++) free(r->extra[i]);
    free(r->missing);
    free(r->extra);
    r->missing = r->extra = NULL;
    r->n_missing = r->n_extra = r->n_loaded = 0;
    r->pos_from_h = r->pos_from_w = 0;
}

static void print_list(FILE *f, char **names, int n) {
    for (int i = 0; i < n && i < LIST_SHOWN; i++) fprintf(f, "%s%s", i ? ", " : "", names[i]);
    if (n > LIST_SHOWN) fprintf(f, ", ... and %d more", n - LIST_SHOWN);
}

void load_report_print(const LoadReport *r, FILE *f) {
    fprintf(f, "loaded %d parameters", r->n_loaded);
    if (r->pos_from_h)
        fprintf(f, " (pos_embed resampled from %dx%d to %dx%d)", r->pos_from_h, r->pos_from_w,
                r->pos_grid_h, r->pos_grid_w);
    if (r->n_missing) {
        fprintf(f, "; %d missing from the file (kept their values): ", r->n_missing);
        print_list(f, r->missing, r->n_missing);
    }
    if (r->n_extra) {
        fprintf(f, "; %d extra tensors in the file (not loaded): ", r->n_extra);
        print_list(f, r->extra, r->n_extra);
        bool map_head = false;
        for (int i = 0; i < r->n_extra; i++) map_head |= strstr(r->extra[i], "attn_pool.") != NULL;
        if (map_head)   // SigLIP's head left out: its summary would then be another vector
            fprintf(f, "\n  note: the file has a MAP head (attn_pool.*); global_pool = map uses it "
                    "(the pooled vector, a teacher's summary)");
    }
    fprintf(f, "\n");
}

static int param_index(const ParamTable *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->params[i]->name, name) == 0) return i;
    return -1;
}

// OpenCLIP's own names of a ViT image tower (after its "visual." prefix) and timm's: a file of
// either kind loads. "#" stands for the block number. OpenCLIP's "proj" (the projection into the
// joint embedding) has no counterpart in the encoder: it stays an extra tensor.
static const struct { const char *openclip, *timm; } kOpenClipNames[] = {
    {"conv1.weight", "patch_embed.proj.weight"},
    {"class_embedding", "cls_token"},
    {"positional_embedding", "pos_embed"},
    {"ln_pre.", "norm_pre."},
    {"ln_post.", "norm."},
    {"transformer.resblocks.#.ln_1.", "blocks.#.norm1."},
    {"transformer.resblocks.#.ln_2.", "blocks.#.norm2."},
    {"transformer.resblocks.#.attn.in_proj_weight", "blocks.#.attn.qkv.weight"},
    {"transformer.resblocks.#.attn.in_proj_bias", "blocks.#.attn.qkv.bias"},
    {"transformer.resblocks.#.attn.out_proj.", "blocks.#.attn.proj."},
    {"transformer.resblocks.#.mlp.c_fc.", "blocks.#.mlp.fc1."},
    {"transformer.resblocks.#.mlp.c_proj.", "blocks.#.mlp.fc2."},
    {"transformer.resblocks.#.ls_1.", "blocks.#.ls1."},
    {"transformer.resblocks.#.ls_2.", "blocks.#.ls2."},
};

// name in OpenCLIP's form -> timm's into out (a pattern ending in "." maps a prefix and keeps
// the rest); false when no pattern matches.
static bool openclip_to_timm(const char *name, char *out, size_t n) {
    for (size_t i = 0; i < sizeof kOpenClipNames / sizeof kOpenClipNames[0]; i++) {
        const char *pat = kOpenClipNames[i].openclip, *hash = strchr(pat, '#');
        size_t head = hash ? (size_t)(hash - pat) : strlen(pat);
        if (strncmp(name, pat, head) != 0) continue;
        const char *rest = name + head, *tail = pat + head;
        long block = -1;
        if (hash) {   // the block number, then the pattern's tail
            char *end;
            block = strtol(rest, &end, 10);
            if (end == rest || block < 0) continue;
            rest = end;
            tail = hash + 1;
        }
        size_t tl = strlen(tail);
        bool prefix_only = pat[strlen(pat) - 1] == '.';
        if (strncmp(rest, tail, tl) != 0 || (!prefix_only && rest[tl] != 0)) continue;
        const char *to = kOpenClipNames[i].timm, *to_hash = strchr(to, '#');
        if (to_hash)
            snprintf(out, n, "%.*s%ld%s%s", (int)(to_hash - to), to, block, to_hash + 1, rest + tl);
        else
            snprintf(out, n, "%s%s", to, rest + tl);
        return true;
    }
    return false;
}

// The parameter a file tensor (its name after the stripped prefix) fills: by timm's name, or by
// OpenCLIP's; -1 when none.
static int file_param_index(const ParamTable *t, const char *name) {
    int k = param_index(t, name);
    char timm[PARAM_NAME_MAX];
    if (k < 0 && openclip_to_timm(name, timm, sizeof timm)) k = param_index(t, timm);
    return k;
}

// A hint for parameters the file lacks: the prefix given that nothing carries, and a prefix
// that would make them match, when there is one.
static void missing_hint(const StFile *f, const char *missing, const char *prefix, char *err, size_t n) {
    append(err, n, "\n  hint: ");
    if (prefix && prefix[0]) {
        bool any = false;
        for (int i = 0; i < f->n && !any; i++) any = strncmp(f->tensors[i].name, prefix, strlen(prefix)) == 0;
        if (!any) append(err, n, "no tensor in the file starts with the prefix '%s'; ", prefix);
    }
    size_t ml = strlen(missing);
    for (int i = 0; i < f->n; i++) {
        const char *name = f->tensors[i].name;
        size_t nl = strlen(name);
        if (nl > ml && name[nl - ml - 1] == '.' && strcmp(name + nl - ml, missing) == 0) {
            append(err, n, "the file has '%s': its names carry the prefix '%.*s' (set the prefix "
                   "to strip, e.g. teacher_prefix)", name, (int)(nl - ml), name);
            return;
        }
    }
    append(err, n, "the file was written for another model; load weights of this model, or allow "
           "missing parameters for a partial init");
}

// The side of the file's square pos_embed grid when file tensor f can be resampled into
// parameter p (r asks for it, p is a pos_embed, same width, the same prefix tokens); 0 when
// resampling does not apply, -1 when it was asked for but the file's grid is not square.
static int resample_source_grid(const Param *p, const StTensor *f, const LoadReport *r) {
    const char *last = strrchr(p->name, '.');
    last = last ? last + 1 : p->name;
    if (r->pos_grid_h <= 0 || r->pos_grid_w <= 0 || strcmp(last, "pos_embed") != 0) return 0;
    int C = tensor_last(&p->value);
    long prefix = (long)(p->value.numel / (size_t)C) - (long)r->pos_grid_h * r->pos_grid_w;
    if (prefix < 0 || f->ndim < 2 || f->shape[f->ndim - 1] != C) return -1;
    for (int d = 0; d < f->ndim - 2; d++)
        if (f->shape[d] != 1) return -1;
    long grid = (long)f->shape[f->ndim - 2] - prefix;
    long side = grid > 0 ? lround(sqrt((double)grid)) : 0;
    return side > 0 && side * side == grid ? (int)side : -1;
}

// Reads file tensor f (prefix + g*g tokens) and resamples its grid into host (p's shape): the
// prefix tokens as they are, the grid bicubic with antialias (timm resample_abs_pos_embed).
static int read_resampled(const StFile *file, const StTensor *f, const Param *p,
                          const LoadReport *r, float *host, char *err, size_t n) {
    int C = tensor_last(&p->value), g = r->pos_from_h;
    int prefix = (int)(p->value.numel / (size_t)C) - r->pos_grid_h * r->pos_grid_w;
    float *src = cg_malloc(f->numel * sizeof(float));
    int rc = st_read_f32_err(file, f, src, err, n);
    if (rc == 0) {
        memcpy(host, src, (size_t)prefix * C * sizeof(float));
        resample_bicubic_aa(src + (size_t)prefix * C, g, g, host + (size_t)prefix * C,
                            r->pos_grid_h, r->pos_grid_w, C);
    }
    free(src);
    return rc;
}

int params_load_safetensors_err(ParamTable *t, Ctx *ctx, const char *path, const char *strip_prefix,
                                LoadReport *r, char *err, size_t n) {
    LoadReport local = {0};
    if (!r) r = &local;
    load_report_free(r);
    StFile f;
    if (st_open_err(&f, path, err, n) != 0) return -1;
    size_t plen = strip_prefix ? strlen(strip_prefix) : 0;
    const StTensor **match = cg_calloc((size_t)(t->n ? t->n : 1), sizeof(StTensor *));
    int rc = 0;
    for (int i = 0; i < f.n; i++) {
        const StTensor *ft = &f.tensors[i];
        int k = plen && strncmp(ft->name, strip_prefix, plen) != 0 ? -1 : file_param_index(t, ft->name + plen);
        if (k < 0) list_add(&r->extra, &r->n_extra, ft->name);
        else match[k] = ft;
    }
    char a[128], b[128];
    int resample_k = -1;   // the parameter whose file tensor is resampled (pos_embed)
    for (int k = 0; k < t->n && rc == 0; k++) {
        const Param *p = t->params[k];
        const StTensor *ft = match[k];
        if (!ft) {
            list_add(&r->missing, &r->n_missing, p->name);
            continue;
        }
        if (!params_shape_matches(&p->value, ft)) {
            int g = resample_source_grid(p, ft, r);
            if (g > 0) {
                resample_k = k;
                r->pos_from_h = r->pos_from_w = g;
                continue;
            }
            shape_str(&p->value, b, sizeof b);
            rc = cg_set_error(err, n, "%s: tensor %s has shape %s, the config expects %s\n"
                      "  hint: %s", path, ft->name, st_shape_str(ft, a, sizeof a), b,
                      g < 0 ? "pos_embed can be resampled only from a square grid of the same "
                              "width and number of prefix (class) tokens"
                            : "the file was written for another model size; use the config it "
                              "was trained with");
        } else if (ft->dtype != ST_F32 && ft->dtype != ST_BF16 && ft->dtype != ST_F16 && ft->dtype != ST_F64) {
            rc = cg_set_error(err, n, "%s: tensor %s has dtype %s; parameters load from F32, BF16, F16 or "
                      "F64", path, ft->name, st_dtype_name(ft->dtype));
        }
    }
    if (rc == 0 && r->n_missing && !r->allow_missing) {
        rc = cg_set_error(err, n, "%s: %d of %d parameters are not in the file: ", path, r->n_missing, t->n);
        for (int i = 0; i < r->n_missing && i < LIST_SHOWN; i++)
            append(err, n, "%s%s", i ? ", " : "", r->missing[i]);
        if (r->n_missing > LIST_SHOWN) append(err, n, ", ... and %d more", r->n_missing - LIST_SHOWN);
        missing_hint(&f, r->missing[0], strip_prefix, err, n);
    }
    for (int k = 0; k < t->n && rc == 0; k++) {
        Param *p = t->params[k];
        if (!match[k]) continue;
        float *host = cg_malloc((p->value.numel ? p->value.numel : 1) * sizeof(float));
        if (k == resample_k) {
            rc = read_resampled(&f, match[k], p, r, host, err, n);
        } else {
            rc = st_read_f32_err(&f, match[k], host, err, n);
        }
        if (rc == 0) params_set_value(t, k, ctx, host);   // rounds to bf16 values; fp32 masters
        free(host);
        if (rc == 0) r->n_loaded++;
    }
    free(match);
    st_close(&f);
    if (r == &local) load_report_free(&local);
    return rc;
}

void params_load_safetensors(ParamTable *t, Ctx *ctx, const char *path, const char *strip_prefix,
                             LoadReport *r) {
    char err[4096];
    if (params_load_safetensors_err(t, ctx, path, strip_prefix, r, err, sizeof err) != 0)
        CG_FAIL("", "%s", err);
}

typedef struct FetchParams { Ctx *ctx; const ParamTable *t; } FetchParams;

static int fetch_param(void *user, int i, void *buf, size_t bytes, char *err, size_t n) {
    FetchParams *fp = user;
    const Tensor *v = &fp->t->params[i]->value;
    if (bytes != tensor_bytes(v)) return cg_set_error(err, n, "parameter %s: size changed", fp->t->params[i]->name);
    tensor_download(fp->ctx, v, buf);
    return 0;
}

int params_save_safetensors_err(const ParamTable *t, Ctx *ctx, const char *path, const StMeta *meta,
                                int n_meta, char *err, size_t n) {
    StWriteTensor *w = cg_calloc((size_t)(t->n ? t->n : 1), sizeof(StWriteTensor));
    for (int i = 0; i < t->n; i++) {
        const Param *p = t->params[i];
        w[i].name = p->name;
        w[i].dtype = p->value.dtype == DTYPE_BF16 ? ST_BF16 : ST_F32;
        w[i].ndim = params_file_shape(p, w[i].shape);
        w[i].data = p->value.device == DEVICE_CPU ? p->value.data : NULL;
    }
    FetchParams fp = {ctx, t};
    int rc = st_write_err(path, w, t->n, meta, n_meta, fetch_param, &fp, err, n);
    free(w);
    return rc;
}

void params_save_safetensors(const ParamTable *t, Ctx *ctx, const char *path, const StMeta *meta,
                             int n_meta) {
    char err[2048];
    if (params_save_safetensors_err(t, ctx, path, meta, n_meta, err, sizeof err) != 0)
        CG_FAIL("check the disk space and permissions of the folder", "%s", err);
}
