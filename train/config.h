// Run configuration (docs/design.md#commands): `key = value` files with `#` comments and `include = x.cfg`,
// then `--key=value` overrides. Every key lives in train/config_keys.h; Config has one field
// per key, with the key's name.
//
// File syntax, one setting per line:
//   key = value          # a trailing comment
//   run_name = "a # b"   # double quotes keep '#' and edge spaces; \" and \\ inside them
//   include = base.cfg   # loaded at this point, path relative to this file's folder
// Later settings override earlier ones. Command-line values are taken literally (no quotes,
// no comments): the shell has already split them.
//
// Every loader comes twice: *_err returns 0 or -1 and writes a message (with a "\n  hint: "
// line where one helps) into err; the plain one exits through CG_FAIL with that message.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define CONFIG_STR_MAX 512        // string values, NUL included
#define CONFIG_INCLUDE_DEPTH 32   // nesting limit for include (cycles are reported before this)

#define CONFIG_FIELD_int(name)    int name;
#define CONFIG_FIELD_float(name)  float name;
#define CONFIG_FIELD_bool(name)   bool name;
#define CONFIG_FIELD_string(name) char name[CONFIG_STR_MAX];

typedef struct Config {
#define X(type, name, def, help) CONFIG_FIELD_##type(name)
#include "config_keys.h"
#undef X
} Config;

// Every field to its default from config_keys.h.
void config_defaults(Config *c);

// Applies the settings of a cfg file (and the files it includes) on top of c.
int  config_load_file_err(Config *c, const char *path, char *err, size_t n);
void config_load_file(Config *c, const char *path);

// One override, "--key=value" or "key=value"; value taken literally. "--include=x.cfg" loads
// x.cfg (relative to the working directory) at that point.
int  config_apply_override_err(Config *c, const char *arg, char *err, size_t n);
void config_apply_override(Config *c, const char *arg);

// Command line argv[first..argc-1]: the first argument not starting with "--" is the config
// file; every "--key=value" is an override, applied after the file whatever its position, in
// order; a bare "--key" naming a bool key sets it to true. Then config_validate.
// Other arguments ("--help", "--flag", a second positional) are not consumed: they are moved,
// in order, to argv[first..first+k-1], and k is returned (-1 on error for the _err form).
// A bare "--key" naming a non-bool key is an error (write --key=value).
int  config_parse_args_err(Config *c, int argc, char **argv, int first, char *err, size_t n);
int  config_parse_args(Config *c, int argc, char **argv, int first);

// Checks values the types alone do not: words from a fixed set (model, gelu, ...), sizes >= 1,
// counts >= 0.
int  config_validate_err(const Config *c, char *err, size_t n);
void config_validate(const Config *c);

// The resolved config as a cfg file that loads back to the same values (floats printed with
// the fewest digits that read back to the same bits).
void config_print(const Config *c, FILE *f);
// Every key with its type, default and help, plus the file syntax: `cgspn train --help`.
void config_print_help(FILE *f);
// Writes config_print's output to path (through path.tmp, renamed when complete).
// Returns 0, or -1 with errno set; check it with CG_CHECK_ERRNO(config_save(c, p) == 0, p).
int  config_save(const Config *c, const char *path);

// The first key (in config_keys.h order) whose value differs between a and b, leaving out the
// n_except keys named in except; NULL when none does. A file that may set only some keys (a
// Stage 2 teacher file) is loaded on top of a copy and compared.
const char *config_first_difference(const Config *a, const Config *b, const char *const *except,
                                    int n_except);

// "378, 518,756" -> {378, 518, 756}: comma and/or space separated ints, for list keys.
// Returns the count (0 for an empty string), or -1 with a message naming `key` when an item is
// not an int or there are more than max of them.
int  config_parse_int_list(const char *key, const char *s, int *out, int max, char *err, size_t n);
// The same for numbers ("4e-4, 2e-4"): finite floats.
int  config_parse_float_list(const char *key, const char *s, float *out, int max, char *err, size_t n);
