// The config key table (train/config_keys.h): lookup, defaults, values, validation, printing.
#include "config_table.h"
#include "../kernels/error.h"
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CFG_TYPE_int    CFG_INT
#define CFG_TYPE_float  CFG_FLOAT
#define CFG_TYPE_bool   CFG_BOOL
#define CFG_TYPE_string CFG_STRING

static const CfgKey kKeys[] = {
#define X(type, name, def, help) {#name, CFG_TYPE_##type, offsetof(Config, name), help},
#include "config_keys.h"
#undef X
};
#define N_KEYS (sizeof kKeys / sizeof kKeys[0])

// String keys whose value is one of a few words ('|'-separated). --help lists the words.
static const struct { const char *key, *words; } kChoices[] = {
    {"model",       "vit|cgspn|hybrid|gspn_hier"},
    {"gelu",        "erf|tanh"},
    {"global_pool", "token|avg|map"},
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

const CfgKey *cfg_key_find(const char *name) {
    for (size_t i = 0; i < N_KEYS; i++)
        if (strcmp(kKeys[i].name, name) == 0) return &kKeys[i];
    return NULL;
}

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

const char *config_first_difference(const Config *a, const Config *b, const char *const *except,
                                    int n_except) {
    for (size_t i = 0; i < N_KEYS; i++) {
        const CfgKey *k = &kKeys[i];
        bool skip = false;
        for (int j = 0; j < n_except && !skip; j++) skip = strcmp(except[j], k->name) == 0;
        if (skip) continue;
        const void *x = cfield(a, k), *y = cfield(b, k);
        _Static_assert(sizeof(int) == 4 && sizeof(float) == 4, "int and float keys compare 4 bytes");
        bool same = k->type == CFG_STRING ? strcmp(x, y) == 0
                  : k->type == CFG_BOOL   ? *(const bool *)x == *(const bool *)y
                  : memcmp(x, y, 4) == 0;   // int, float: the bits
        if (!same) return k->name;
    }
    return NULL;
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

int cfg_fail_unknown_key(char *err, size_t n, const char *key, const char *where) {
    const char *s = config_suggest(key);
    if (s)
        return cg_set_error(err, n, "unknown config key '%s' (%s)\n  hint: did you mean '%s'? "
                    "('--help' lists every key)", key, where, s);
    return cg_set_error(err, n, "unknown config key '%s' (%s)\n  hint: '--help' lists every key", key, where);
}

// ---------------------------------------------------------------------------------------------
// Values

int cfg_set_value(Config *c, const CfgKey *k, const char *v, const char *where,
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
        *(int *)cfg_field(c, k) = (int)x;
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
        *(float *)cfg_field(c, k) = x;
        return 0;
    }
    case CFG_BOOL: {
        bool x;
        if (strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0) x = true;
        else if (strcmp(v, "0") == 0 || strcasecmp(v, "false") == 0) x = false;
        else return cg_set_error(err, n, "bad value '%s' for config key '%s' (%s): expected a bool "
                         "(0, 1, true or false)", v, k->name, where);
        *(bool *)cfg_field(c, k) = x;
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
        char *dst = cfg_field(c, k);
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
        const CfgKey *k = cfg_key_find(kChoices[i].key);
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
        const CfgKey *k = cfg_key_find(kIntMin[i].key);
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
