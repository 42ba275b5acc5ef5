// PyTorch's numbers (bench/timm_json.h): a reader for the one flat JSON object that
// bench/bench_timm.py writes ("key": number or "key": "string", one per line).
#include "timm_json.h"
#include "../kernels/device.h"
#include "../kernels/error.h"
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define TIMM_JSON_DEFAULT "build/bench_timm.json"

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    CG_CHECK(fseek(f, 0, SEEK_END) == 0, "", "%s: cannot seek", path);
    long n = ftell(f);
    CG_CHECK(n >= 0 && fseek(f, 0, SEEK_SET) == 0, "", "%s: cannot read its size", path);
    char *s = cg_malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    CG_CHECK(got == (size_t)n, "", "%s: read %zu of %ld bytes", path, got, n);
    s[got] = 0;
    fclose(f);
    return s;
}

double timm_json_number(const char *json, const char *key) {
    if (!json) return 0;
    char pat[256];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    if (!p) return 0;
    p += strlen(pat);
    while (*p == ' ') p++;
    char *end;
    double v = strtod(p, &end);
    return end == p ? 0 : v;
}

double timm_json_numberf(const char *json, const char *fmt, ...) {
    char key[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(key, sizeof key, fmt, ap);
    va_end(ap);
    return timm_json_number(json, key);
}

void timm_json_string(const char *json, const char *key, char *buf, size_t n) {
    snprintf(buf, n, "?");
    if (!json) return;
    char pat[256];
    snprintf(pat, sizeof pat, "\"%s\": \"", key);
    const char *p = strstr(json, pat);
    if (!p) return;
    p += strlen(pat);
    size_t i = 0;
    while (p[i] && p[i] != '"' && i + 1 < n) {
        buf[i] = p[i];
        i++;
    }
    buf[i] = 0;
}

char *timm_json_load(FILE *out) {
    const char *path = getenv("CGSPN_BENCH_TIMM_JSON");
    if (!path || !path[0]) path = TIMM_JSON_DEFAULT;
    char *json = read_text(path);
    if (!json) {
        fprintf(out, "PyTorch: %s not found (`make bench` runs bench/bench_timm.py first, on a "
                     "machine with torch and timm)\n", path);
        return NULL;
    }
    char dev[128], date[64], torch_v[64], timm_v[64];
    timm_json_string(json, "device", dev, sizeof dev);
    timm_json_string(json, "date", date, sizeof date);
    timm_json_string(json, "torch", torch_v, sizeof torch_v);
    timm_json_string(json, "timm", timm_v, sizeof timm_v);
    // bench_timm.py names the device "cpu" when it ran there (--device cpu --smoke)
    const char *here = "cpu";
    DeviceInfo gpu;
    if (device_gpu_count() > 0) {
        gpu = device_gpu_info(0);
        here = gpu.name;
    }
    fprintf(out, "PyTorch: %s (bench/bench_timm.py on %s, %s; torch %s, timm %s)%s\n", path, dev,
            date, torch_v, timm_v,
            strcmp(dev, here) == 0 ? "" : "  ** another device: ratios are not comparable **");
    return json;
}
