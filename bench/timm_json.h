// PyTorch's numbers for the cgspn benches: the flat JSON object bench/bench_timm.py writes
// (build/bench_timm.json, or $CGSPN_BENCH_TIMM_JSON), read by `cgspn bench vit`, `block` and
// `distill` to print beside their own.
#pragma once
#include <stddef.h>
#include <stdio.h>

// Loads the file and prints one line saying where the numbers come from (device, date, torch and
// timm versions; flagged when the device is not GPU 0's). NULL, with a line saying so, when absent.
char *timm_json_load(FILE *out);
// The number under "key"; 0 when absent, null or json is NULL.
double timm_json_number(const char *json, const char *key);
// The same with the key built from a printf format.
double timm_json_numberf(const char *json, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
// The string under "key" into buf ("?" when absent).
void timm_json_string(const char *json, const char *key, char *buf, size_t n);
