// The key table's interface to the parser (train/config.c): a key found, a value set.
#pragma once
#include "config.h"

typedef enum { CFG_INT, CFG_FLOAT, CFG_BOOL, CFG_STRING } CfgType;

typedef struct {
    const char *name;
    CfgType type;
    size_t offset;      // of the field in Config
    const char *help;
} CfgKey;

static inline void *cfg_field(Config *c, const CfgKey *k) { return (char *)c + k->offset; }

// The key named name, or NULL.
const CfgKey *cfg_key_find(const char *name);
// Parses v as k's type into c's field; `where` (file:line, or the command line) names the place in
// the message of a bad value.
int cfg_set_value(Config *c, const CfgKey *k, const char *v, const char *where, char *err, size_t n);
// The message for an unknown key (with the closest known one as a hint); returns -1.
int cfg_fail_unknown_key(char *err, size_t n, const char *key, const char *where);
