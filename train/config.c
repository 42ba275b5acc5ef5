// Config files, overrides, validation, printing: see config.h. The key table is config_keys.h.
#include "config.h"
#include "device_config.h"
#include "../kernels/error.h"
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef enum { CFG_INT, CFG_FLOAT, CFG_BOOL, CFG_STRING } CfgType;
#define CFG_TYPE_int    CFG_INT
#define CFG_TYPE_float  CFG_FLOAT
#define CFG_TYPE_bool   CFG_BOOL
#define CFG_TYPE_string CFG_STRING

typedef struct {
    const char *name;
    CfgType type;
    size_t offset;      // of the field in Config
    const char *help;
} CfgKey;

static const CfgKey kKeys[] = {
#define X(type, name, def, help) {#name, CFG_TYPE_##type, offsetof(Config, name), help},
#include "config_keys.h"
#undef X
};
#define N_KEYS (sizeof kKeys / sizeof kKeys[0])

// String keys whose value is one of a few words ('|'-separated). --help lists the words.
static const struct { const char *key, *words; } kChoices[] = {
    {"model",       "vit|cgspn|hybrid"},
    {"gelu",        "erf|tanh"},
    {"global_pool", "token|avg"},
    {"precision",   "auto|fp32|bf16"},
    {"device",      "auto|cpu|cuda"},
    {"interpolation", "bilinear|bicubic"},
    {"on_nonfinite", "stop|skip"},
    {"stage1_train", "gspn|gspn_norm1"},
};

// Int keys with a lower bound: sizes are >= 1, counts >= 0.
static const struct { const char *key; int min; } kIntMin[] = {
    {"img_size", 1}, {"in_chans", 1}, {"patch", 1}, {"width", 1}, {"depth", 1},
    {"heads", 1}, {"mlp_hidden", 1}, {"num_classes", 0}, {"batch_size", 1},
    {"epochs", 0}, {"max_steps", 0}, {"warmup_steps", 0}, {"eval_every", 0},
    {"log_every", 0}, {"threads", 0}, {"ckpt_every", 0}, {"keep_last", 0},
    {"accum_steps", 1}, {"lr_scale_batch", 0}, {"eval_batch_size", 0},
    {"stage", 1}, {"adaptor_hidden", 0}, {"teacher_img_size", 0},
};

static const char *type_name(CfgType t) {
    switch (t) {
    case CFG_INT:    return "int";
    case CFG_FLOAT:  return "float";
    case CFG_BOOL:   return "bool";
    case CFG_STRING: return "string";
    }
    return "?";
}

static const CfgKey *key_find(const char *name) {
    for (size_t i = 0; i < N_KEYS; i++)
        if (strcmp(kKeys[i].name, name) == 0) return &kKeys[i];
    return NULL;
}

static void *field(Config *c, const CfgKey *k) { return (char *)c + k->offset; }
static const void *cfield(const Config *c, const CfgKey *k) { return (const char *)c + k->offset; }


// ---------------------------------------------------------------------------------------------
// Defaults

#define CONFIG_SET_int(c, name, def)    (c)->name = (def);
#define CONFIG_SET_float(c, name, def)  (c)->name = (def);
#define CONFIG_SET_bool(c, name, def)   (c)->name = (def) != 0;
#define CONFIG_SET_string(c, name, def) snprintf((c)->name, CONFIG_STR_MAX, "%s", def);

void config_defaults(Config *c) {
    memset(c, 0, sizeof *c);   // padding and string tails too, so two equal configs memcmp equal
#define X(type, name, def, help) CONFIG_SET_##type(c, name, def)
#include "config_keys.h"
#undef X
}

// ---------------------------------------------------------------------------------------------
// "Did you mean": the known key closest to an unknown one.

// Optimal string alignment distance (edits: insert, delete, substitute, swap two neighbours),
// case-insensitive, '-' equal to '_'. Strings are cut at 63 characters.
static int edit_distance(const char *a, const char *b) {
    enum { M = 64 };
    char s[M], t[M];
    int n = 0, m = 0;
    for (; a[n] && n < M - 1; n++) s[n] = a[n] == '-' ? '_' : (char)tolower((unsigned char)a[n]);
    for (; b[m] && m < M - 1; m++) t[m] = b[m] == '-' ? '_' : (char)tolower((unsigned char)b[m]);
    int d[M][M];
    for (int i = 0; i <= n; i++) d[i][0] = i;
    for (int j = 0; j <= m; j++) d[0][j] = j;
    for (int i = 1; i <= n; i++) {
        for (int j = 1; j <= m; j++) {
            int cost = s[i - 1] != t[j - 1];
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && s[i - 1] == t[j - 2] && s[i - 2] == t[j - 1] && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[n][m];
}

// First letter of each '_' / '-' separated word: "learning_rate" -> "lr". Returns the word count.
static int initials(const char *s, char *out, size_t n) {
    size_t k = 0;
    int words = 0;
    for (size_t i = 0; s[i]; i++) {
        if (s[i] == '_' || s[i] == '-') continue;
        if (i == 0 || s[i - 1] == '_' || s[i - 1] == '-') {
            words++;
            if (k + 1 < n) out[k++] = (char)tolower((unsigned char)s[i]);
        }
    }
    out[k] = '\0';
    return words;
}

// True when needle is whole words of hay: "warmup" in "warmup_steps".
static bool whole_words_in(const char *needle, const char *hay) {
    size_t len = strlen(needle);
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) {
        bool starts = p == hay || p[-1] == '_';
        bool ends = p[len] == '\0' || p[len] == '_';
        if (starts && ends) return true;
    }
    return false;
}

static const char *config_suggest(const char *unknown) {
    char ini[64];
    int words = initials(unknown, ini, sizeof ini);
    size_t len = strlen(unknown);
    int best = INT_MAX;
    const char *best_name = NULL;
    for (size_t i = 0; i < N_KEYS; i++) {
        const char *name = kKeys[i].name;
        int d = edit_distance(unknown, name);
        if (words >= 2 && strcmp(ini, name) == 0 && d > 1) d = 1;   // learning_rate -> lr
        if (len >= 3 && d > 2 && (whole_words_in(unknown, name) || whole_words_in(name, unknown)))
            d = 2;                                                   // warmup -> warmup_steps
        if (d < best) best = d, best_name = name;
    }
    int limit = len <= 3 ? 1 : (int)(len / 3 > 2 ? len / 3 : 2);
    return best <= limit ? best_name : NULL;
}

static int fail_unknown_key(char *err, size_t n, const char *key, const char *where) {
    const char *s = config_suggest(key);
    if (s)
        return cg_set_error(err, n, "unknown config key '%s' (%s)\n  hint: did you mean '%s'? "
                    "('--help' lists every key)", key, where, s);
    return cg_set_error(err, n, "unknown config key '%s' (%s)\n  hint: '--help' lists every key", key, where);
}

// ---------------------------------------------------------------------------------------------
// Values

static int set_value(Config *c, const CfgKey *k, const char *v, const char *where,
                     char *err, size_t n) {
    switch (k->type) {
    case CFG_INT: {
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (!v[0] || isspace((unsigned char)v[0]) || *end)
            return cg_set_error(err, n, "bad value '%s' for config key '%s' (%s): expected an int",
                        v, k->name, where);
        if (errno == ERANGE || x < INT_MIN || x > INT_MAX)
            return cg_set_error(err, n, "bad value '%s' for config key '%s' (%s): expected an int "
                        "from %d to %d", v, k->name, where, INT_MIN, INT_MAX);
        *(int *)field(c, k) = (int)x;
        return 0;
    }
    case CFG_FLOAT: {
        char *end;
        errno = 0;
        float x = strtof(v, &end);
        if (!v[0] || isspace((unsigned char)v[0]) || *end)
            return cg_set_error(err, n, "bad value '%s' for config key '%s' (%s): expected a float "
                        "such as 0.001 or 1e-3", v, k->name, where);
        if (!isfinite(x) || (errno == ERANGE && x == 0.0f))
            return cg_set_error(err, n, "bad value '%s' for config key '%s' (%s): expected a finite "
                        "float (magnitude from 1.4e-45 to 3.4e38, or 0)", v, k->name, where);
        *(float *)field(c, k) = x;
        return 0;
    }
    case CFG_BOOL: {
        bool x;
        if (strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0) x = true;
        else if (strcmp(v, "0") == 0 || strcasecmp(v, "false") == 0) x = false;
        else return cg_set_error(err, n, "bad value '%s' for config key '%s' (%s): expected a bool "
                         "(0, 1, true or false)", v, k->name, where);
        *(bool *)field(c, k) = x;
        return 0;
    }
    case CFG_STRING: {
        size_t len = strlen(v);
        if (len >= CONFIG_STR_MAX)
            return cg_set_error(err, n, "value for config key '%s' (%s) is %zu bytes long; strings "
                        "hold at most %d", k->name, where, len, CONFIG_STR_MAX - 1);
        for (size_t i = 0; i < len; i++)
            if ((unsigned char)v[i] < 0x20 || v[i] == 0x7f)
                return cg_set_error(err, n, "value for config key '%s' (%s) contains control "
                            "character 0x%02x", k->name, where, (unsigned char)v[i]);
        char *dst = field(c, k);
        memset(dst, 0, CONFIG_STR_MAX);
        memcpy(dst, v, len);
        return 0;
    }
    }
    return cg_set_error(err, n, "config key '%s': unhandled type", k->name);
}

// Shortest "%.*g" that reads back to the same float bits, exponent without leading zeros
// ("1e-06" -> "1e-6").
static void format_float(float v, char *buf, size_t n) {
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, n, "%.*g", p, (double)v);
        float back = strtof(buf, NULL);
        if (memcmp(&back, &v, sizeof v) == 0) break;
    }
    char *e = strchr(buf, 'e');
    if (!e) return;
    char *digits = e + 1 + (e[1] == '+' || e[1] == '-');
    char *first = digits;
    while (first[0] == '0' && first[1]) first++;
    memmove(digits, first, strlen(first) + 1);
    if (e[1] == '+') memmove(e + 1, e + 2, strlen(e + 2) + 1);
}

// The value as it is written in a cfg file (strings quoted, '"' and '\' escaped).
static void format_value(const Config *c, const CfgKey *k, char *buf, size_t n) {
    const void *p = cfield(c, k);
    switch (k->type) {
    case CFG_INT:   snprintf(buf, n, "%d", *(const int *)p); return;
    case CFG_FLOAT: format_float(*(const float *)p, buf, n); return;
    case CFG_BOOL:  snprintf(buf, n, "%d", *(const bool *)p ? 1 : 0); return;
    case CFG_STRING: {
        const char *s = p;
        size_t j = 0;
        buf[j++] = '"';
        for (size_t i = 0; s[i] && j + 3 < n; i++) {
            if (s[i] == '"' || s[i] == '\\') buf[j++] = '\\';
            buf[j++] = s[i];
        }
        buf[j++] = '"';
        buf[j] = '\0';
        return;
    }
    }
}

// ---------------------------------------------------------------------------------------------
// Files

typedef struct {
    char *real[CONFIG_INCLUDE_DEPTH];    // realpath of each file being loaded, outermost first
    char *shown[CONFIG_INCLUDE_DEPTH];   // its path as resolved from the including file
    int depth;
} LoadStack;

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
    return s;
}

static int load_file(Config *c, const char *path, const char *from, LoadStack *st,
                     char *err, size_t n);

// "include = x" inside `path`: x relative to path's folder (unless absolute).
static int load_include(Config *c, const char *path, const char *value, const char *where,
                        LoadStack *st, char *err, size_t n) {
    if (!value[0]) return cg_set_error(err, n, "include with no file name (%s)", where);
    char joined[PATH_MAX];
    const char *slash = strrchr(path, '/');
    int len = value[0] == '/' || !slash
            ? snprintf(joined, sizeof joined, "%s", value)
            : snprintf(joined, sizeof joined, "%.*s/%s", (int)(slash - path), path, value);
    if (len < 0 || (size_t)len >= sizeof joined)
        return cg_set_error(err, n, "include path too long (%s)", where);
    return load_file(c, joined, where, st, err, n);
}

// One `key = value` line (comment not yet removed). line is modified.
static int load_line(Config *c, const char *path, int lineno, char *line, LoadStack *st,
                     char *err, size_t n) {
    char where[PATH_MAX + 32];
    snprintf(where, sizeof where, "%s:%d", path, lineno);
    size_t len = strlen(line);
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';

    char *eq = strchr(line, '='), *hash = strchr(line, '#');
    if (hash && (!eq || hash < eq)) *hash = '\0', eq = NULL;   // comment before any '='
    if (!eq) {
        char *t = trim(line);
        if (!t[0]) return 0;
        return cg_set_error(err, n, "line '%s' has no '=' (%s)\n  hint: settings are written "
                    "'key = value'; comments start with '#'", t, where);
    }
    *eq = '\0';
    char *key = trim(line);
    char *value = eq + 1;
    while (isspace((unsigned char)*value)) value++;
    if (!key[0]) return cg_set_error(err, n, "missing key before '=' (%s)", where);

    if (*value == '"') {                       // quoted: \" and \\ are escapes, '#' is text
        char *src = value + 1, *dst = value;
        for (;;) {
            if (!*src) return cg_set_error(err, n, "unterminated quoted value for '%s' (%s)", key, where);
            if (*src == '"') break;
            if (src[0] == '\\' && (src[1] == '"' || src[1] == '\\')) src++;
            *dst++ = *src++;
        }
        char *rest = src + 1;
        *dst = '\0';
        while (isspace((unsigned char)*rest)) rest++;
        if (*rest && *rest != '#')
            return cg_set_error(err, n, "text after the closing quote of '%s' (%s): '%s'", key, where, rest);
    } else {
        char *h = strchr(value, '#');
        if (h) *h = '\0';
        value = trim(value);
    }

    if (strcmp(key, "include") == 0) return load_include(c, path, value, where, st, err, n);
    const CfgKey *k = key_find(key);
    if (!k) return fail_unknown_key(err, n, key, where);
    return set_value(c, k, value, where, err, n);
}

// Loads `path` (a file named by `from`, or the top-level one when from is NULL).
static int load_file(Config *c, const char *path, const char *from, LoadStack *st,
                     char *err, size_t n) {
    char *real = realpath(path, NULL);
    FILE *f = real ? fopen(path, "r") : NULL;
    if (!f) {
        int e = errno;
        free(real);
        if (from)
            return cg_set_error(err, n, "cannot open included config file '%s' (%s): %s", path, from,
                        strerror(e));
        return cg_set_error(err, n, "cannot open config file '%s': %s", path, strerror(e));
    }
    for (int i = 0; i < st->depth; i++) {
        if (strcmp(st->real[i], real) != 0) continue;
        char chain[4096];
        size_t k = 0;
        for (int j = i; j < st->depth && k < sizeof chain; j++)
            k += (size_t)snprintf(chain + k, sizeof chain - k, "%s -> ", st->shown[j]);
        fclose(f);
        free(real);
        return cg_set_error(err, n, "include cycle: %s%s (%s)", chain, path, from);
    }
    if (st->depth == CONFIG_INCLUDE_DEPTH) {
        fclose(f);
        free(real);
        return cg_set_error(err, n, "includes nested deeper than %d (%s)", CONFIG_INCLUDE_DEPTH, from);
    }
    st->real[st->depth] = real;
    st->shown[st->depth] = cg_strdup(path);
    st->depth++;

    int rc = 0, lineno = 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) != -1) {
        lineno++;
        char *text = line;
        if (lineno == 1 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) text += 3;   // UTF-8 BOM
        rc = load_line(c, path, lineno, text, st, err, n);
        if (rc) break;
    }
    if (!rc && ferror(f)) rc = cg_set_error(err, n, "reading config file '%s': %s", path, strerror(errno));
    free(line);
    fclose(f);
    st->depth--;
    free(st->real[st->depth]);
    free(st->shown[st->depth]);
    return rc;
}

int config_load_file_err(Config *c, const char *path, char *err, size_t n) {
    LoadStack st = {.depth = 0};
    return load_file(c, path, NULL, &st, err, n);
}

void config_load_file(Config *c, const char *path) {
    char err[2048];
    if (config_load_file_err(c, path, err, sizeof err)) CG_FAIL("", "%s", err);
}

// ---------------------------------------------------------------------------------------------
// Command line

int config_apply_override_err(Config *c, const char *arg, char *err, size_t n) {
    char where[600];
    snprintf(where, sizeof where, "command line: %.500s", arg);
    const char *kv = strncmp(arg, "--", 2) == 0 ? arg + 2 : arg;
    const char *eq = strchr(kv, '=');
    if (!eq)
        return cg_set_error(err, n, "override '%s' has no '='\n  hint: write --key=value", arg);
    char key[128];
    if ((size_t)(eq - kv) >= sizeof key) return fail_unknown_key(err, n, "(too long)", where);
    memcpy(key, kv, (size_t)(eq - kv));
    key[eq - kv] = '\0';
    const char *value = eq + 1;
    if (strcmp(key, "include") == 0) {
        LoadStack st = {.depth = 0};
        return load_file(c, value, where, &st, err, n);
    }
    const CfgKey *k = key_find(key);
    if (!k) return fail_unknown_key(err, n, key, where);
    return set_value(c, k, value, where, err, n);
}

void config_apply_override(Config *c, const char *arg) {
    char err[2048];
    if (config_apply_override_err(c, arg, err, sizeof err)) CG_FAIL("", "%s", err);
}

// The command line's `--key=value` overrides and bare boolean flags, applied to c; the other
// arguments (not the config file argv[cfg]) are compacted to argv[first..] and counted.
static int apply_command_line(Config *c, int argc, char **argv, int first, int cfg, char *err,
                              size_t n) {
    int rest = first;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (i == cfg) continue;
        if (strncmp(a, "--", 2) == 0 && a[2] && strchr(a, '=')) {
            if (config_apply_override_err(c, a, err, n)) return -1;
            continue;
        }
        const CfgKey *k = strncmp(a, "--", 2) == 0 ? key_find(a + 2) : NULL;
        if (k && k->type == CFG_BOOL) {
            *(bool *)field(c, k) = true;
            continue;
        }
        if (k)
            return cg_set_error(err, n, "config key '%s' needs a value (command line: %s)\n"
                        "  hint: write --%s=VALUE", k->name, a, k->name);
        argv[rest++] = argv[i];
    }
    return rest - first;
}

// cpu_config of the top-level file (its includes included), when the run will be on a CPU: that
// file, relative to the top-level one's folder, is used instead (loaded over `before`, the
// config as it was before the top-level file), so none of the GPU recipe's keys leak into the
// CPU run. Whether the run is on a CPU is probed with the command line applied to a copy
// (--device=cpu counts). The key is a loading directive, not a setting: it is cleared, so
// resolved configs written into run folders never carry it.
static int apply_cpu_config(Config *c, const Config *before, int argc, char **argv, int first,
                            int cfg, char *err, size_t n) {
    char file[CONFIG_STR_MAX];
    snprintf(file, sizeof file, "%s", c->cpu_config);
    c->cpu_config[0] = '\0';
    if (!file[0]) return 0;
    Config probe = *c;
    char **scratch = cg_malloc((size_t)argc * sizeof *scratch);
    memcpy(scratch, argv, (size_t)argc * sizeof *scratch);
    int rc = apply_command_line(&probe, argc, scratch, first, cfg, err, n);
    free(scratch);
    if (rc < 0) return -1;
    if (!device_is_cpu(&probe)) return 0;
    const char *top = argv[cfg], *slash = strrchr(top, '/');
    char path[PATH_MAX];
    int len = file[0] == '/' || !slash ? snprintf(path, sizeof path, "%s", file)
                                       : snprintf(path, sizeof path, "%.*s/%s", (int)(slash - top), top, file);
    if (len < 0 || (size_t)len >= sizeof path)
        return cg_set_error(err, n, "cpu_config path too long (%s)", top);
    printf("note: running on the CPU: %s (cpu_config of %s) instead of its GPU-sized recipe\n",
           path, top);
    *c = *before;
    LoadStack st = {.depth = 0};
    char where[PATH_MAX + 32];
    snprintf(where, sizeof where, "cpu_config of %s", top);
    if (load_file(c, path, where, &st, err, n)) return -1;
    c->cpu_config[0] = '\0';
    return 0;
}

int config_parse_args_err(Config *c, int argc, char **argv, int first, char *err, size_t n) {
    int cfg = -1;
    for (int i = first; i < argc; i++)
        if (argv[i][0] != '-') { cfg = i; break; }
    Config before = *c;
    if (cfg >= 0 && config_load_file_err(c, argv[cfg], err, n)) return -1;
    if (cfg >= 0 && apply_cpu_config(c, &before, argc, argv, first, cfg, err, n)) return -1;
    int rest = apply_command_line(c, argc, argv, first, cfg, err, n);
    if (rest < 0) return -1;
    c->cpu_config[0] = '\0';   // only a config file's counts (see apply_cpu_config)
    if (config_validate_err(c, err, n)) return -1;
    return rest;
}

int config_parse_args(Config *c, int argc, char **argv, int first) {
    char err[2048];
    int k = config_parse_args_err(c, argc, argv, first, err, sizeof err);
    if (k < 0) CG_FAIL("", "%s", err);
    return k;
}

// ---------------------------------------------------------------------------------------------
// Validation

static bool word_in(const char *v, const char *words) {
    size_t len = strlen(v);
    for (const char *p = words; *p;) {
        const char *bar = strchr(p, '|');
        size_t wl = bar ? (size_t)(bar - p) : strlen(p);
        if (wl == len && strncmp(p, v, len) == 0) return true;
        if (!bar) break;
        p = bar + 1;
    }
    return false;
}

static const char *choices_of(const char *key) {
    for (size_t i = 0; i < sizeof kChoices / sizeof kChoices[0]; i++)
        if (strcmp(kChoices[i].key, key) == 0) return kChoices[i].words;
    return NULL;
}

int config_validate_err(const Config *c, char *err, size_t n) {
    for (size_t i = 0; i < sizeof kChoices / sizeof kChoices[0]; i++) {
        const CfgKey *k = key_find(kChoices[i].key);
        if (!k || k->type != CFG_STRING)
            return cg_set_error(err, n, "kChoices names '%s', which is not a string config key",
                        kChoices[i].key);
        const char *v = cfield(c, k);
        if (!word_in(v, kChoices[i].words)) {
            char list[256];
            size_t j = 0;
            for (const char *p = kChoices[i].words; *p && j + 4 < sizeof list; p++) {
                if (*p == '|') j += (size_t)snprintf(list + j, sizeof list - j, " | ");
                else list[j++] = *p;
            }
            list[j] = '\0';
            return cg_set_error(err, n, "config key '%s' is '%s'; expected one of: %s", k->name, v, list);
        }
    }
    for (size_t i = 0; i < sizeof kIntMin / sizeof kIntMin[0]; i++) {
        const CfgKey *k = key_find(kIntMin[i].key);
        if (!k || k->type != CFG_INT)
            return cg_set_error(err, n, "kIntMin names '%s', which is not an int config key",
                        kIntMin[i].key);
        int v = *(const int *)cfield(c, k);
        if (v < kIntMin[i].min)
            return cg_set_error(err, n, "config key '%s' is %d; it must be at least %d", k->name, v,
                        kIntMin[i].min);
    }
    return 0;
}

void config_validate(const Config *c) {
    char err[2048];
    if (config_validate_err(c, err, sizeof err)) CG_FAIL("", "%s", err);
}

// ---------------------------------------------------------------------------------------------
// Printing

void config_print(const Config *c, FILE *f) {
    int w = 0;
    for (size_t i = 0; i < N_KEYS; i++) {
        int len = (int)strlen(kKeys[i].name);
        if (len > w) w = len;
    }
    char buf[2 * CONFIG_STR_MAX + 4];
    fprintf(f, "# cgspn resolved config\n");
    for (size_t i = 0; i < N_KEYS; i++) {
        format_value(c, &kKeys[i], buf, sizeof buf);
        fprintf(f, "%-*s = %s\n", w, kKeys[i].name, buf);
    }
}

void config_print_help(FILE *f) {
    Config d;
    config_defaults(&d);
    char buf[2 * CONFIG_STR_MAX + 4];
    int wn = 3, wd = 7;
    for (size_t i = 0; i < N_KEYS; i++) {
        int len = (int)strlen(kKeys[i].name);
        if (len > wn) wn = len;
        format_value(&d, &kKeys[i], buf, sizeof buf);
        len = (int)strlen(buf);
        if (len > wd && len <= 16) wd = len;   // longer defaults overflow their column
    }
    fprintf(f,
        "Configuration: a CONFIG file of 'key = value' lines, then --key=value overrides\n"
        "(applied after the file). In files: '#' starts a comment, \"double quotes\" keep '#'\n"
        "and edge spaces in a value, 'include = other.cfg' loads a file relative to the\n"
        "including one. Bools take 0, 1, true or false; a bare --key sets a bool key to 1.\n\n");
    fprintf(f, "  %-*s  %-6s  %-*s  %s\n", wn, "key", "type", wd, "default", "meaning");
    for (size_t i = 0; i < N_KEYS; i++) {
        const CfgKey *k = &kKeys[i];
        format_value(&d, k, buf, sizeof buf);
        fprintf(f, "  %-*s  %-6s  %-*s  %s", wn, k->name, type_name(k->type), wd, buf, k->help);
        const char *words = choices_of(k->name);
        if (words) {
            fputs(": ", f);
            for (const char *p = words; *p; p++) {
                if (*p == '|') fputs(" | ", f);
                else fputc(*p, f);
            }
        }
        fprintf(f, "\n");
    }
}

int config_save(const Config *c, const char *path) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    FILE *f = fopen(tmp, "w");
    if (!f) return -1;
    config_print(c, f);
    int bad = fflush(f) != 0 || ferror(f);
    int e = errno;
    if (fclose(f) != 0 && !bad) bad = 1, e = errno;
    if (bad) {
        remove(tmp);
        errno = e;
        return -1;
    }
    return rename(tmp, path) == 0 ? 0 : -1;
}

// ---------------------------------------------------------------------------------------------
// Lists

// The next item of a list separated by commas or spaces, copied NUL-terminated into item (cap
// bytes); *p moves past it. Returns 0 at the end, 1 for an item, -1 for one too long (*len set).
static int list_next(const char **p, char *item, size_t cap, const char **start, size_t *len) {
    while (**p == ',' || isspace((unsigned char)**p)) (*p)++;
    if (!**p) return 0;
    const char *end = *p;
    while (*end && *end != ',' && !isspace((unsigned char)*end)) end++;
    *start = *p;
    *len = (size_t)(end - *p);
    *p = end;
    if (*len >= cap) return -1;
    memcpy(item, *start, *len);
    item[*len] = '\0';
    return 1;
}

int config_parse_int_list(const char *key, const char *s, int *out, int max, char *err, size_t n) {
    int count = 0, got;
    const char *p = s, *start;
    size_t len;
    char item[32];
    while ((got = list_next(&p, item, sizeof item, &start, &len)) != 0) {
        char *stop = item;
        long v = 0;
        errno = 0;
        if (got > 0) v = strtol(item, &stop, 10);
        if (got < 0 || *stop || stop == item || errno == ERANGE || v < INT_MIN || v > INT_MAX)
            return cg_set_error(err, n, "config key '%s' is '%s': item '%.*s' is not an int "
                        "(expected ints separated by commas or spaces)", key, s, (int)len, start);
        if (count == max)
            return cg_set_error(err, n, "config key '%s' is '%s': more than %d items", key, s, max);
        out[count++] = (int)v;
    }
    return count;
}

int config_parse_float_list(const char *key, const char *s, float *out, int max, char *err, size_t n) {
    int count = 0, got;
    const char *p = s, *start;
    size_t len;
    char item[48];
    while ((got = list_next(&p, item, sizeof item, &start, &len)) != 0) {
        char *stop = item;
        double v = 0;
        if (got > 0) v = strtod(item, &stop);
        if (got < 0 || *stop || stop == item || !isfinite(v))
            return cg_set_error(err, n, "config key '%s' is '%s': item '%.*s' is not a number "
                        "(expected numbers separated by commas or spaces)", key, s, (int)len, start);
        if (count == max)
            return cg_set_error(err, n, "config key '%s' is '%s': more than %d items", key, s, max);
        out[count++] = (float)v;
    }
    return count;
}
