// safetensors reader and writer (nn/safetensors.h) and the parameter table's weight files
// (nn/params_io.h): byte-exact agreement with files written by the reference implementation,
// round trips, dtype conversions, malformed files rejected with messages naming the file and
// tensor, shape mismatches, missing and extra tensors, prefixes, timm's shapes.
#include "testlib.h"
#include "../nn/params_io.h"
#include "../nn/safetensors.h"
#include "../nn/encoder.h"
#include "../kernels/ops.h"
#include "../train/model_config.h"
#include <unistd.h>

// bf16 keeps 8 significant bits: round to nearest is within half an ulp, 2^-8 relative.
#define BF16_REL_ERR (1.0f / 256.0f)

static char g_dir[256];   // a fresh temp folder per test

static int setup_dir(void **state) { return test_make_temp_dir(g_dir, sizeof g_dir, "st"); }
static int teardown_dir(void **state) { return test_remove_dir(g_dir); }

static const char *tmp_path(const char *name) {
    static char paths[8][512];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 512, "%s/%s", g_dir, name);
    return p;
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

// A file of header (length prefixed, no padding added) and data.
static const char *write_st(const char *name, const char *header, const void *data, size_t n) {
    const char *path = tmp_path(name);
    size_t hl = strlen(header);
    uint8_t *buf = malloc(8 + hl + n + 1);
    uint64_t len = hl;
    memcpy(buf, &len, 8);
    memcpy(buf + 8, header, hl);
    if (n) memcpy(buf + 8 + hl, data, n);
    write_bytes(path, buf, 8 + hl + n);
    free(buf);
    return path;
}

// Opening path fails with a message containing every part (NULL-terminated list).
static void expect_open_error(const char *path, ...) {
    StFile f;
    char err[2048] = "";
    assert_int_equal(st_open_err(&f, path, err, sizeof err), -1);
    assert_contains(err, path);
    va_list ap;
    va_start(ap, path);
    for (const char *part; (part = va_arg(ap, const char *)) != NULL;) assert_contains(err, part);
    va_end(ap);
    printf("    %s\n", err);
}

static void hex_to_bytes(const char *hex, uint8_t *out) {
    for (size_t i = 0; hex[2 * i]; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (uint8_t)v;
    }
}

// ---- the reference implementation's bytes -----------------------------------------------------
// Written by Python safetensors 0.8.0:
//   save_file({"b": np.array([1.5, -2.0, 65504.0, 6e-8], np.float16),
//              "a": np.arange(6, dtype=np.float32).reshape(2, 3),
//              "c": np.array([7, -1], np.int64), "z.x": np.zeros((0, 3), np.float32)},
//             path, metadata={"k": "v", "q\"uote": "x\ny"})
static const char kRefHeader[] =
    "{\"__metadata__\":{\"k\":\"v\",\"q\\\"uote\":\"x\\ny\"},"
    "\"c\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]},"
    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[16,40]},"
    "\"z.x\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[40,40]},"
    "\"b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[40,48]}}    ";
static const char kRefData[] =
    "0700000000000000ffffffffffffffff000000000000803f0000004000004040000080400000a040003e00c0ff7b0100";

static void test_writer_output_is_byte_identical_to_reference_implementation(void **state) {
    float a[6] = {0, 1, 2, 3, 4, 5};
    uint16_t b[4] = {0x3e00, 0xc000, 0x7bff, 0x0001};   // 1.5, -2, 65504, 2^-24 in IEEE half
    int64_t c[2] = {7, -1};
    float z[1] = {0};
    StWriteTensor t[] = {
        {"b", ST_F16, 1, {4}, b}, {"a", ST_F32, 2, {2, 3}, a},
        {"c", ST_I64, 1, {2}, c}, {"z.x", ST_F32, 2, {0, 3}, z},
    };
    StMeta meta[] = {{"k", "v"}, {"q\"uote", "x\ny"}};
    const char *path = tmp_path("ours.safetensors");
    char err[1024];
    assert_int_equal(st_write_err(path, t, 4, meta, 2, NULL, NULL, err, sizeof err), 0);
    size_t n;
    uint8_t *got = test_read_bytes(path, &n);
    size_t hl = sizeof kRefHeader - 1, dl = strlen(kRefData) / 2;
    assert_int_equal(hl % 8, 0);
    assert_int_equal(n, 8 + hl + dl);
    uint64_t len;
    memcpy(&len, got, 8);
    assert_int_equal(len, hl);
    assert_memory_equal(got + 8, kRefHeader, hl);
    uint8_t data[64];
    hex_to_bytes(kRefData, data);
    assert_memory_equal(got + 8 + hl, data, dl);
    free(got);
    assert_int_equal(access(tmp_path("ours.safetensors.tmp"), F_OK), -1);   // renamed away
}

static void test_reader_parses_reference_file_and_converts_f16(void **state) {
    uint8_t data[64];
    hex_to_bytes(kRefData, data);
    const char *path = write_st("ref.safetensors", kRefHeader, data, strlen(kRefData) / 2);
    StFile f;
    st_open(&f, path);
    assert_int_equal(f.n, 4);
    assert_string_equal(st_meta(&f, "k"), "v");
    assert_string_equal(st_meta(&f, "q\"uote"), "x\ny");
    assert_null(st_meta(&f, "absent"));
    const StTensor *a = st_find(&f, "a"), *b = st_find(&f, "b"), *c = st_find(&f, "c");
    const StTensor *z = st_find(&f, "z.x");
    assert_non_null(a); assert_non_null(b); assert_non_null(c); assert_non_null(z);
    assert_int_equal(a->dtype, ST_F32);
    assert_int_equal(a->ndim, 2);
    assert_int_equal(a->shape[0], 2);
    assert_int_equal(a->shape[1], 3);
    assert_int_equal(z->numel, 0);
    float fa[6], fb[4];
    char err[1024];
    assert_int_equal(st_read_f32_err(&f, a, fa, err, sizeof err), 0);
    for (int i = 0; i < 6; i++) assert_true(fa[i] == (float)i);
    assert_int_equal(st_read_f32_err(&f, b, fb, err, sizeof err), 0);
    assert_true(fb[0] == 1.5f && fb[1] == -2.0f && fb[2] == 65504.0f);
    assert_true(fb[3] == ldexpf(1.0f, -24));   // the smallest half subnormal
    int64_t c64[2];
    memcpy(c64, st_data(&f, c), sizeof c64);
    assert_true(c64[0] == 7 && c64[1] == -1);
    assert_int_equal(st_read_f32_err(&f, c, fb, err, sizeof err), -1);   // I64 is not float
    assert_contains(err, "tensor 'c' has dtype I64");
    st_close(&f);
}

// ---- round trips and conversions -------------------------------------------------------------

static void test_round_trip_f32_bits_and_bf16_conversion(void **state) {
    enum { N = 1000 };
    float *x = malloc(N * sizeof(float));
    uint16_t *h = malloc(N * sizeof(uint16_t));
    uint64_t seed = 7;
    for (int i = 0; i < N; i++) {
        x[i] = (float)((test_rng_next(&seed) >> 40) * (1.0 / 16777216.0) - 0.5) * 1e3f;
        h[i] = f32_to_bf16(x[i]);
    }
    x[0] = -0.0f;
    x[1] = INFINITY;
    x[2] = NAN;
    StWriteTensor t[] = {{"w.f32", ST_F32, 3, {10, 10, 10}, x}, {"w.bf16", ST_BF16, 2, {N, 1}, h}};
    const char *path = tmp_path("rt.safetensors");
    char err[1024];
    assert_int_equal(st_write_err(path, t, 2, NULL, 0, NULL, NULL, err, sizeof err), 0);
    StFile f;
    assert_int_equal(st_open_err(&f, path, err, sizeof err), 0);
    assert_int_equal(f.header_len % 8, 0);
    assert_int_equal(f.n_meta, 0);
    float *y = malloc(N * sizeof(float));
    assert_int_equal(st_read_f32_err(&f, st_find(&f, "w.f32"), y, err, sizeof err), 0);
    assert_memory_equal(x, y, N * sizeof(float));   // bit for bit, NaN and -0 included
    assert_int_equal(st_read_f32_err(&f, st_find(&f, "w.bf16"), y, err, sizeof err), 0);
    for (int i = 3; i < N; i++) {
        assert_true(y[i] == bf16_to_f32(h[i]));
        assert_true(fabsf(y[i] - x[i]) <= BF16_REL_ERR * fabsf(x[i]));
    }
    st_close(&f);
    free(x); free(h); free(y);
}

static void test_bf16_rounds_to_nearest_even_and_keeps_nan(void **state) {
    assert_int_equal(f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(f32_to_bf16(1.0f + ldexpf(1, -8)), 0x3f80);            // tie: even (down)
    assert_int_equal(f32_to_bf16(1.0f + 3 * ldexpf(1, -8)), 0x3f82);        // tie: even (up)
    assert_int_equal(f32_to_bf16(1.0f + ldexpf(1, -8) + ldexpf(1, -20)), 0x3f81);
    assert_int_equal(f32_to_bf16(-2.0f), 0xc000);
    assert_int_equal(f32_to_bf16(INFINITY), 0x7f80);
    assert_true(isnan(bf16_to_f32(f32_to_bf16(NAN))));
    assert_true(bf16_to_f32(0x3f80) == 1.0f);
}

static void test_f16_to_f32_covers_subnormals_inf_nan(void **state) {
    assert_true(st_f16_to_f32(0x3c00) == 1.0f);
    assert_true(st_f16_to_f32(0x0400) == ldexpf(1, -14));              // smallest normal
    assert_true(st_f16_to_f32(0x03ff) == ldexpf(1023, -24));           // largest subnormal
    assert_true(st_f16_to_f32(0x0200) == ldexpf(1, -15));
    assert_true(st_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(st_f16_to_f32(0x7c00) == INFINITY);
    assert_true(st_f16_to_f32(0xfc00) == -INFINITY);
    assert_true(isnan(st_f16_to_f32(0x7e00)));
    float nz = st_f16_to_f32(0x8000);
    assert_true(nz == 0.0f && signbit(nz));
    assert_true(st_f16_to_f32(0xc000) == -2.0f);
}

static void test_json_escapes_and_unknown_fields_are_handled(void **state) {
    float v[2] = {1, 2};
    const char *path = write_st("esc.safetensors",
        "{ \"a\\u00e9\\ud83d\\ude00\\\"\" : {\"dtype\":\"F32\", \"extra\": {\"x\": [1, 2.5e3, true, null]},"
        " \"shape\" : [ 2 ], \"data_offsets\":[0, 8]} ,\n \"__metadata__\": {} }  ", v, sizeof v);
    StFile f;
    st_open(&f, path);
    assert_int_equal(f.n, 1);
    assert_string_equal(f.tensors[0].name, "a\xc3\xa9\xf0\x9f\x98\x80\"");
    st_close(&f);
}

// ---- malformed files -------------------------------------------------------------------------

static void test_empty_and_truncated_files_are_rejected(void **state) {
    const char *path = tmp_path("empty.safetensors");
    write_bytes(path, "", 0);
    expect_open_error(path, "has 0 bytes", "hint:", NULL);

    float v[4] = {1, 2, 3, 4};
    StWriteTensor t[] = {{"weight", ST_F32, 1, {4}, v}};
    char err[1024];
    path = tmp_path("trunc.safetensors");
    assert_int_equal(st_write_err(path, t, 1, NULL, 0, NULL, NULL, err, sizeof err), 0);
    size_t n;
    uint8_t *full = test_read_bytes(path, &n);
    write_bytes(path, full, n - 4);   // data cut short
    expect_open_error(path, "tensor 'weight'", "past the end of the data section (12 bytes)",
                      "truncated", NULL);
    write_bytes(path, full, 20);      // header cut short
    expect_open_error(path, "header length", "only 12 bytes follow", NULL);
    uint64_t huge = 1ull << 40;
    memcpy(full, &huge, 8);
    write_bytes(path, full, n);
    expect_open_error(path, "over the format's limit", NULL);
    free(full);
}

static void test_bad_json_is_rejected_with_position(void **state) {
    float v[2] = {0};
    expect_open_error(write_st("j1.safetensors", "{\"a\" {\"dtype\":\"F32\"}}", v, 8),
                      "header byte 5", "expected ':'", NULL);
    expect_open_error(write_st("j2.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                               "\"data_offsets\":[0,8]}} x", v, 8),
                      "unexpected characters after the header object", NULL);
    expect_open_error(write_st("j3.safetensors", "{\"a:{}}", v, 8), "unterminated string", NULL);
    expect_open_error(write_st("j4.safetensors", "[1, 2]", v, 8), "expected '{'", NULL);
    expect_open_error(write_st("j5.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],"
                               "\"data_offsets\":[0,8]}}", v, 8),
                      "tensor 'a': shape: expected a non-negative integer", NULL);
    expect_open_error(write_st("j6.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", v, 8),
                      "tensor 'a' has no \"data_offsets\"", NULL);
    expect_open_error(write_st("j7.safetensors", "{\"__metadata__\":{\"k\":1}}", v, 8),
                      "__metadata__ values must be strings", NULL);
    expect_open_error(write_st("j8.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                               "\"data_offsets\":[0,8,9]}}", v, 8),
                      "data_offsets has 3 entries", NULL);
    expect_open_error(write_st("j9.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                               "\"data_offsets\":[0,99999999999999999999]}}", v, 8),
                      "does not fit in 64 bits", NULL);
}

static void test_bad_offsets_dtypes_and_names_are_rejected(void **state) {
    float v[6] = {0};
    expect_open_error(write_st("o1.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],"
                               "\"data_offsets\":[8,24]}}", v, 16),
                      "tensor 'w' has data_offsets [8, 24], past the end of the data section (16 bytes)",
                      NULL);
    expect_open_error(write_st("o2.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],"
                               "\"data_offsets\":[8,0]}}", v, 16),
                      "tensor 'w' has data_offsets [8, 0]: begin after end", NULL);
    expect_open_error(write_st("o3.safetensors",
                               "{\"p\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                               "\"q\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", v, 24),
                      "tensors 'p' [0, 16) and 'q' [8, 16) overlap", NULL);
    expect_open_error(write_st("o4.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],"
                               "\"data_offsets\":[0,8]}}", v, 16),
                      "tensor 'w' has data_offsets [0, 8] (8 bytes), but dtype F32 and shape (3) "
                      "need 12 bytes", NULL);
    expect_open_error(write_st("o5.safetensors", "{\"w\":{\"dtype\":\"F4\",\"shape\":[2],"
                               "\"data_offsets\":[0,1]}}", v, 16),
                      "tensor 'w' has dtype 'F4', which this reader does not know", "BF16", NULL);
    expect_open_error(write_st("o6.safetensors",
                               "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                               "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", v, 8),
                      "tensor 'w' appears twice", NULL);
}

static void test_writer_rejects_duplicate_names_and_reports_io_errors(void **state) {
    float v[2] = {0};
    StWriteTensor t[] = {{"w", ST_F32, 1, {2}, v}, {"w", ST_BF16, 1, {2}, v}};
    char err[1024];
    assert_int_equal(st_write_err(tmp_path("dup.safetensors"), t, 2, NULL, 0, NULL, NULL, err, sizeof err), -1);
    assert_contains(err, "tensor 'w' given twice");
    assert_int_equal(st_write_err(tmp_path("no/such/dir/x.safetensors"), t, 1, NULL, 0, NULL, NULL,
                                  err, sizeof err), -1);
    assert_contains(err, "No such file or directory");
}

// ---- parameter tables --------------------------------------------------------------------------

typedef struct Model {
    Encoder enc;
    ParamTable t;
    Ctx ctx;
} Model;

// A tiny ViT (or other model) from config overrides, initialized from seed.
static Model *model_new(uint64_t seed, int width, int num_classes) {
    Model *m = calloc(1, sizeof(Model));
    Config c;
    config_defaults(&c);
    c.width = width;
    c.depth = 1;
    c.heads = 2;
    c.mlp_hidden = 2 * width;
    c.patch = 7;
    c.num_classes = num_classes;
    EncoderConfig ec = encoder_config_from(&c);
    m->ctx = ctx_cpu();
    params_init_table(&m->t);
    encoder_register(&m->enc, &ec, &m->t);
    params_alloc(&m->t, &m->ctx);
    params_initialize(&m->t, &m->ctx, seed);
    return m;
}

static void model_free(Model *m) {
    params_free(&m->t, &m->ctx);
    free(m);
}

static bool tables_equal(const ParamTable *a, const ParamTable *b) {
    if (a->n != b->n) return false;
    for (int i = 0; i < a->n; i++)
        if (memcmp(a->params[i]->value.data, b->params[i]->value.data, tensor_bytes(&a->params[i]->value)))
            return false;
    return true;
}

static void test_params_round_trip_with_timm_shapes(void **state) {
    Model *a = model_new(1, 16, 10), *b = model_new(2, 16, 10);
    assert_false(tables_equal(&a->t, &b->t));
    const char *path = tmp_path("model.safetensors");
    StMeta meta[] = {{"format", "pt"}};
    params_save_safetensors(&a->t, &a->ctx, path, meta, 1);
    StFile f;
    st_open(&f, path);
    assert_int_equal(f.n, a->t.n);
    const StTensor *pos = st_find(&f, "pos_embed"), *cls = st_find(&f, "cls_token");
    assert_int_equal(pos->ndim, 3);   // timm's (1, N, C)
    assert_true(pos->shape[0] == 1 && pos->shape[1] == 17 && pos->shape[2] == 16);
    assert_int_equal(cls->ndim, 3);   // timm's (1, 1, C)
    assert_int_equal(st_find(&f, "blocks.0.attn.qkv.weight")->shape[0], 48);   // (out, in)
    assert_string_equal(st_meta(&f, "format"), "pt");
    st_close(&f);
    LoadReport r = {0};
    params_load_safetensors(&b->t, &b->ctx, path, NULL, &r);
    assert_int_equal(r.n_loaded, a->t.n);
    assert_int_equal(r.n_missing, 0);
    assert_int_equal(r.n_extra, 0);
    assert_true(tables_equal(&a->t, &b->t));
    load_report_free(&r);
    model_free(a);
    model_free(b);
}

static void test_shape_mismatch_names_tensor_and_both_shapes(void **state) {
    Model *a = model_new(1, 32, 10), *b = model_new(2, 16, 10), *keep = model_new(2, 16, 10);
    const char *path = tmp_path("w32.safetensors");
    params_save_safetensors(&a->t, &a->ctx, path, NULL, 0);
    char err[2048];
    assert_int_equal(params_load_safetensors_err(&b->t, &b->ctx, path, NULL, NULL, err, sizeof err), -1);
    printf("    %s\n", err);
    char want[600];
    snprintf(want, sizeof want, "%s: tensor patch_embed.proj.weight has shape (32, 1, 7, 7), the "
             "config expects (16, 1, 7, 7)\n  hint: ", path);
    assert_contains(err, want);
    assert_true(tables_equal(&b->t, &keep->t));   // nothing changed on error
    model_free(a);
    model_free(b);
    model_free(keep);
}

static void test_missing_tensors_are_errors_unless_allowed(void **state) {
    Model *a = model_new(1, 16, 0), *b = model_new(2, 16, 10);   // a has no head
    const char *path = tmp_path("nohead.safetensors");
    params_save_safetensors(&a->t, &a->ctx, path, NULL, 0);
    char err[2048];
    assert_int_equal(params_load_safetensors_err(&b->t, &b->ctx, path, NULL, NULL, err, sizeof err), -1);
    printf("    %s\n", err);
    assert_contains(err, "2 of");
    assert_contains(err, "are not in the file: head.weight, head.bias");
    assert_contains(err, "allow missing parameters");
    LoadReport r = {.allow_missing = true};
    Param *hw = params_find(&b->t, "head.weight");
    float keep = tensor_f32(&hw->value)[0];
    assert_int_equal(params_load_safetensors_err(&b->t, &b->ctx, path, NULL, &r, err, sizeof err), 0);
    assert_int_equal(r.n_loaded, a->t.n);
    assert_int_equal(r.n_missing, 2);
    assert_string_equal(r.missing[0], "head.weight");
    assert_true(tensor_f32(&hw->value)[0] == keep);   // kept its value
    Param *qkv = params_find(&b->t, "blocks.0.attn.qkv.weight");
    assert_memory_equal(qkv->value.data, params_find(&a->t, "blocks.0.attn.qkv.weight")->value.data,
                        tensor_bytes(&qkv->value));
    load_report_print(&r, stdout);
    load_report_free(&r);
    model_free(a);
    model_free(b);
}

// The load report points at a MAP head the config leaves out (a SigLIP file read with
// global_pool = token or avg), and says nothing of it otherwise.
static void test_load_report_names_a_map_head_left_out(void **state) {
    (void)state;
    char *extra_map[] = {"attn_pool.latent", "attn_pool.q.weight"}, *extra_proj[] = {"proj"};
    for (int k = 0; k < 2; k++) {
        LoadReport r = {.n_loaded = 3, .n_extra = k ? 1 : 2, .extra = k ? extra_proj : extra_map};
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        load_report_print(&r, f);
        fclose(f);
        printf("    %s", text);
        if (k == 0) assert_contains(text, "global_pool = map uses it");
        else assert_null(strstr(text, "attn_pool"));
        free(text);
    }
}

// An OpenCLIP-style file: names under "visual.trunk.", a text tower beside, timm's 4-D conv
// weight, bf16 data. Returns the path; values are bf16 roundings of a's.
static const char *write_openclip_style(const Model *a, bool with_2d_pos) {
    int n = a->t.n;
    StWriteTensor *w = calloc((size_t)n + 1, sizeof(StWriteTensor));
    char **names = calloc((size_t)n, sizeof(char *));
    uint16_t **data = calloc((size_t)n, sizeof(uint16_t *));
    for (int i = 0; i < n; i++) {
        const Param *p = a->t.params[i];
        names[i] = malloc(strlen(p->name) + 16);
        sprintf(names[i], "visual.trunk.%s", p->name);
        data[i] = malloc(p->value.numel * 2 + 2);
        for (size_t k = 0; k < p->value.numel; k++) data[i][k] = f32_to_bf16(tensor_f32(&p->value)[k]);
        w[i] = (StWriteTensor){names[i], ST_BF16, 0, {0}, data[i]};
        w[i].ndim = params_file_shape(p, w[i].shape);
        if (strcmp(p->name, "patch_embed.proj.weight") == 0) {   // (D, C, p, p)
            w[i].ndim = 4;
            w[i].shape[1] = 1;
            w[i].shape[2] = w[i].shape[3] = 7;
        }
        if (with_2d_pos && strcmp(p->name, "pos_embed") == 0) {
            w[i].ndim = 2;
            w[i].shape[0] = p->value.shape[0];
            w[i].shape[1] = p->value.shape[1];
        }
    }
    float text[3] = {1, 2, 3};
    w[n] = (StWriteTensor){"text.token_embedding.weight", ST_F32, 1, {3}, text};
    const char *path = tmp_path(with_2d_pos ? "openclip2.safetensors" : "openclip.safetensors");
    char err[1024];
    assert_int_equal(st_write_err(path, w, n + 1, NULL, 0, NULL, NULL, err, sizeof err), 0);
    for (int i = 0; i < n; i++) free(names[i]), free(data[i]);
    free(names); free(data); free(w);
    return path;
}

static void test_prefix_4d_conv_and_bf16_load_into_fp32_table(void **state) {
    Model *a = model_new(1, 16, 10), *b = model_new(2, 16, 10);
    for (int pass = 0; pass < 2; pass++) {
        const char *path = write_openclip_style(a, pass == 1);
        LoadReport r = {0};
        char err[2048];
        assert_int_equal(params_load_safetensors_err(&b->t, &b->ctx, path, "visual.trunk.", &r, err,
                                                     sizeof err), 0);
        assert_int_equal(r.n_loaded, a->t.n);
        assert_int_equal(r.n_extra, 1);
        assert_string_equal(r.extra[0], "text.token_embedding.weight");
        for (int i = 0; i < a->t.n; i++) {
            const Tensor *x = &a->t.params[i]->value, *y = &b->t.params[i]->value;
            for (size_t k = 0; k < x->numel; k++)
                assert_true(tensor_f32(y)[k] == bf16_to_f32(f32_to_bf16(tensor_f32(x)[k])));
        }
        load_report_free(&r);
        // Without the prefix nothing matches; the hint names the prefix to strip.
        assert_int_equal(params_load_safetensors_err(&b->t, &b->ctx, path, NULL, NULL, err, sizeof err), -1);
        if (pass == 0) printf("    %s\n", err);
        assert_contains(err, "the prefix 'visual.trunk.'");
        assert_int_equal(params_load_safetensors_err(&b->t, &b->ctx, path, "visual.tower.", NULL, err,
                                                     sizeof err), -1);
        assert_contains(err, "no tensor in the file starts with the prefix 'visual.tower.'");
    }
    model_free(a);
    model_free(b);
}

// OpenCLIP's own names for its ViT image tower (open_clip's VisionTransformer under "visual."),
// written out by hand for a 2-block CLIP-like model (norm_pre, layer scale, no head): the file
// loads into timm's names, value for value; its "proj" stays extra.
static const char *openclip_name(const char *timm, char *out, size_t n) {
    static const char *const pairs[][2] = {
        {"patch_embed.proj.weight", "conv1.weight"}, {"cls_token", "class_embedding"},
        {"pos_embed", "positional_embedding"}, {"norm_pre.weight", "ln_pre.weight"},
        {"norm_pre.bias", "ln_pre.bias"}, {"norm.weight", "ln_post.weight"}, {"norm.bias", "ln_post.bias"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        if (strcmp(timm, pairs[i][0]) == 0) return snprintf(out, n, "visual.%s", pairs[i][1]), out;
    static const char *const block[][2] = {
        {"norm1.", "ln_1."}, {"norm2.", "ln_2."}, {"attn.qkv.weight", "attn.in_proj_weight"},
        {"attn.qkv.bias", "attn.in_proj_bias"}, {"attn.proj.", "attn.out_proj."},
        {"mlp.fc1.", "mlp.c_fc."}, {"mlp.fc2.", "mlp.c_proj."}, {"ls1.", "ls_1."}, {"ls2.", "ls_2."},
    };
    int b, used;
    assert_int_equal(sscanf(timm, "blocks.%d.%n", &b, &used), 1);
    const char *rest = timm + used;
    for (size_t i = 0; i < sizeof block / sizeof block[0]; i++) {
        size_t len = strlen(block[i][0]);
        if (strncmp(rest, block[i][0], len) == 0) {
            snprintf(out, n, "visual.transformer.resblocks.%d.%s%s", b, block[i][1], rest + len);
            return out;
        }
    }
    fail_msg("no OpenCLIP name for %s", timm);
    return NULL;
}

static void test_openclip_names_load_into_timms(void **state) {
    Config c;
    config_defaults(&c);
    c.width = 16, c.depth = 2, c.heads = 2, c.mlp_hidden = 32, c.patch = 7, c.num_classes = 0;
    c.norm_pre = 1, c.layer_scale_init = 0.5f;
    EncoderConfig ec = encoder_config_from(&c);
    Model a = {.ctx = ctx_cpu()}, b = {.ctx = ctx_cpu()};
    Model *m[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        params_init_table(&m[i]->t);
        encoder_register(&m[i]->enc, &ec, &m[i]->t);
        params_alloc(&m[i]->t, &m[i]->ctx);
        params_initialize(&m[i]->t, &m[i]->ctx, 10 + (uint64_t)i);
        test_fill(&m[i]->t.params[0]->value, 20 + (uint64_t)i, -1, 1);   // norms differ too
    }
    int n = a.t.n;
    StWriteTensor *w = calloc((size_t)n + 1, sizeof(StWriteTensor));
    char (*names)[128] = calloc((size_t)n, sizeof *names);
    for (int i = 0; i < n; i++) {
        const Param *p = a.t.params[i];
        w[i] = (StWriteTensor){openclip_name(p->name, names[i], sizeof names[i]), ST_F32, 0, {0},
                               p->value.data};
        w[i].ndim = p->value.ndim;   // OpenCLIP's forms: class_embedding (C), positional_embedding (T, C)
        for (int d = 0; d < p->value.ndim; d++) w[i].shape[d] = p->value.shape[d];
        if (strcmp(p->name, "cls_token") == 0) w[i].ndim = 1, w[i].shape[0] = c.width;
    }
    float proj[16 * 4] = {0};
    w[n] = (StWriteTensor){"visual.proj", ST_F32, 2, {16, 4}, proj};
    const char *path = tmp_path("open_clip_vit.safetensors");
    char err[2048];
    assert_int_equal(st_write_err(path, w, n + 1, NULL, 0, NULL, NULL, err, sizeof err), 0);
    assert_false(tables_equal(&a.t, &b.t));
    LoadReport r = {0};
    if (params_load_safetensors_err(&b.t, &b.ctx, path, "visual.", &r, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(r.n_loaded, n);
    assert_int_equal(r.n_extra, 1);
    assert_string_equal(r.extra[0], "visual.proj");
    assert_true(tables_equal(&a.t, &b.t));
    load_report_free(&r);
    free(w);
    free(names);
    params_free(&a.t, &a.ctx);
    params_free(&b.t, &b.ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_report_names_a_map_head_left_out),
        cmocka_unit_test_setup_teardown(test_writer_output_is_byte_identical_to_reference_implementation, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_reader_parses_reference_file_and_converts_f16, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_round_trip_f32_bits_and_bf16_conversion, setup_dir, teardown_dir),
        cmocka_unit_test(test_bf16_rounds_to_nearest_even_and_keeps_nan),
        cmocka_unit_test(test_f16_to_f32_covers_subnormals_inf_nan),
        cmocka_unit_test_setup_teardown(test_json_escapes_and_unknown_fields_are_handled, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_empty_and_truncated_files_are_rejected, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_bad_json_is_rejected_with_position, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_bad_offsets_dtypes_and_names_are_rejected, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_writer_rejects_duplicate_names_and_reports_io_errors, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_params_round_trip_with_timm_shapes, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_shape_mismatch_names_tensor_and_both_shapes, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_missing_tensors_are_errors_unless_allowed, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_prefix_4d_conv_and_bf16_load_into_fp32_table, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_openclip_names_load_into_timms, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
