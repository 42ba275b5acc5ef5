// libFuzzer target: the config file parser (train/config.c, with the key table of
// train/config_table.c) on arbitrary bytes. Built and run by tools/fuzz.sh.
//
// The parser reads only files (config_load_file_err, through config_parse_args_err as `cgspn
// train FILE` does), so each input is written to FILE in a folder of this process that also
// holds files for `include =` and `cpu_config =` to load (two small ones, and copies of the
// folder $FUZZ_CONFIG_DIR names: tools/fuzz.sh passes configs/). Then:
//  - a first input line "--key=value" is also applied as an override, and every line is parsed
//    as an int and a float list (config_parse_int_list / _float_list, which list keys use);
//  - a config that loads is printed (config_print) and loaded back, and must come back the same
//    (config_print promises that): a difference aborts, so libFuzzer keeps the input.
#include "../../train/config.h"
#include "../../train/device_config.h"
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FUZZ_LINE_MAX 4096   // longer lines are not tried as overrides or lists (speed only)

// config.c asks whether the run is on the CPU to pick cpu_config; the real answer needs the
// device layer (train/device_config.c and below), which this target does not link. A CPU-only
// build answers this: anything but device = cuda runs on the CPU.
bool device_is_cpu(const Config *c) { return strcmp(c->device, "cuda") != 0; }

static char g_dir[64], g_cfg[128], g_back[128];

static void write_file(const char *name, const char *text, size_t len) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(text, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "fuzz_config: cannot write %s\n", p);
        abort();
    }
}

// Copies every *.cfg of dir into g_dir, so that the includes of the seeds (configs/*.cfg name
// their siblings: "include = fmnist_vit.cfg") load real files.
static void copy_configs(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".cfg") != 0) continue;
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        FILE *f = fopen(p, "rb");
        if (!f) continue;
        char buf[1 << 16];
        size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        write_file(e->d_name, buf, len);
    }
    closedir(d);
}

static void remove_dir(void) {
    DIR *d = opendir(g_dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
                char p[4200];
                snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    // tmpfs when there is one: a file rewritten per input on ext4 is flushed on truncation.
    snprintf(g_dir, sizeof g_dir, "%s/cgspn_fuzz_cfg_XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(g_dir)) abort();
    snprintf(g_cfg, sizeof g_cfg, "%s/fuzz.cfg", g_dir);
    snprintf(g_back, sizeof g_back, "%s/back.cfg", g_dir);
    // Names a short input can reach ("include = base.cfg", "cpu_config = cpu.cfg"), then the
    // folder tools/fuzz.sh names (the repository's configs/).
    static const char base[] = "model = vit\nembed_dim = 64   # a comment\nrun_name = \"a # b\"\n";
    static const char cpu[] = "include = base.cfg\ndevice = cpu\nlr = 1e-3\n";
    write_file("base.cfg", base, sizeof base - 1);
    write_file("cpu.cfg", cpu, sizeof cpu - 1);
    const char *dir = getenv("FUZZ_CONFIG_DIR");
    if (dir) copy_configs(dir);
    atexit(remove_dir);
    return 0;
}

static bool has(const uint8_t *data, size_t size, const char *word) {
    size_t n = strlen(word);
    for (size_t i = 0; i + n <= size; i++)
        if (memcmp(data + i, word, n) == 0) return true;
    return false;
}

// The input's lines, NUL-terminated, each tried as int and float lists; the first also as an
// override when it starts with "--", as the command line's do (only those: an unknown key costs
// a "did you mean" search over every key, and most lines of a file, "key = value" with its
// spaces, are unknown keys as overrides).
static void fuzz_lines(const uint8_t *data, size_t size, bool loads_files) {
    char err[2048], line[FUZZ_LINE_MAX + 1];
    int ints[64];
    float floats[64];
    for (size_t i = 0; i < size;) {
        size_t j = i;
        while (j < size && data[j] != '\n') j++;
        if (j - i <= FUZZ_LINE_MAX) {
            memcpy(line, data + i, j - i);
            line[j - i] = '\0';
            // "--include=x" loads x relative to the working directory (the repository): only
            // inputs kept to this process's folder load files (see LLVMFuzzerTestOneInput).
            if (i == 0 && !loads_files && strncmp(line, "--", 2) == 0) {
                Config c;
                config_defaults(&c);
                config_apply_override_err(&c, line, err, sizeof err);
            }
            config_parse_int_list("fuzz", line, ints, 64, err, sizeof err);
            config_parse_float_list("fuzz", line, floats, 64, err, sizeof err);
        }
        i = j + 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[2048];
    // include and cpu_config name files to read: an absolute or "../" path could reach a FIFO or
    // /dev/zero and hang the run or fill its memory. Inputs that name either key have '/'
    // replaced, so every file they reach is in g_dir (regular files this process wrote).
    bool loads_files = has(data, size, "include") || has(data, size, "cpu_config");
    uint8_t *text = malloc(size ? size : 1);
    memcpy(text, data, size);
    if (loads_files)
        for (size_t i = 0; i < size; i++)
            if (text[i] == '/') text[i] = '_';

    FILE *f = fopen(g_cfg, "wb");
    if (!f) abort();
    fwrite(text, 1, size, f);
    fclose(f);

    Config c;
    config_defaults(&c);
    char *argv[] = {"train", g_cfg, NULL};
    if (config_parse_args_err(&c, 2, argv, 1, err, sizeof err) >= 0) {
        f = fopen(g_back, "w");
        if (!f) abort();
        config_print(&c, f);
        fclose(f);
        Config back;
        config_defaults(&back);
        if (config_load_file_err(&back, g_back, err, sizeof err) != 0) {
            fprintf(stderr, "fuzz_config: config_print's output does not load: %s\n", err);
            abort();
        }
        const char *key = config_first_difference(&c, &back, NULL, 0);
        if (key) {
            fprintf(stderr, "fuzz_config: key '%s' differs after config_print and reload\n", key);
            abort();
        }
        unlink(g_back);   // the next input must not reach this one's output through an include
    }
    fuzz_lines(text, size, loads_files);
    free(text);
    return 0;
}
