// Config files, includes and command lines parsed (config.h); the keys are config_table.c's.
#include "config_table.h"
#include "device_config.h"
#include "../kernels/error.h"
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    const CfgKey *k = cfg_key_find(key);
    if (!k) return cfg_fail_unknown_key(err, n, key, where);
    return cfg_set_value(c, k, value, where, err, n);
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
    if ((size_t)(eq - kv) >= sizeof key) return cfg_fail_unknown_key(err, n, "(too long)", where);
    memcpy(key, kv, (size_t)(eq - kv));
    key[eq - kv] = '\0';
    const char *value = eq + 1;
    if (strcmp(key, "include") == 0) {
        LoadStack st = {.depth = 0};
        return load_file(c, value, where, &st, err, n);
    }
    const CfgKey *k = cfg_key_find(key);
    if (!k) return cfg_fail_unknown_key(err, n, key, where);
    return cfg_set_value(c, k, value, where, err, n);
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
        const CfgKey *k = strncmp(a, "--", 2) == 0 ? cfg_key_find(a + 2) : NULL;
        if (k && k->type == CFG_BOOL) {
            *(bool *)cfg_field(c, k) = true;
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
