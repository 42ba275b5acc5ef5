#include "cli_args.h"
#include "../kernels/error.h"

const char *cli_take_flag(int *argc, char **argv, int first, const char *name) {
    size_t len = strlen(name);
    for (int i = first; i < *argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, name, len) != 0 || (a[len] != '\0' && a[len] != '=')) continue;
        const char *value;
        int used = 1;
        if (a[len] == '=') {
            value = a + len + 1;
        } else {
            CG_CHECK(i + 1 < *argc, "", "%s needs a value (%s PATH)", name, name);
            value = argv[i + 1];
            used = 2;
        }
        CG_CHECK(value[0] != '\0', "", "%s needs a value", name);
        for (int k = i; k + used < *argc; k++) argv[k] = argv[k + used];
        *argc -= used;
        return value;
    }
    return NULL;
}

bool cli_take_switch(int *argc, char **argv, int first, const char *name) {
    for (int i = first; i < *argc; i++)
        if (strcmp(argv[i], name) == 0) {
            for (int k = i; k + 1 < *argc; k++) argv[k] = argv[k + 1];
            (*argc)--;
            return true;
        }
    const char *v = cli_take_flag(argc, argv, first, name);
    if (!v) return false;
    CG_CHECK(strcmp(v, "0") == 0 || strcmp(v, "1") == 0, "", "%s=%s: expected %s, %s=1 or %s=0",
             name, v, name, name, name);
    return v[0] == '1';
}

int cli_wants_help(int argc, char **argv, int first) {
    for (int i = first; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return 1;
    return 0;
}
