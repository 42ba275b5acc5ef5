// A run's folder (out_dir/run_name) and its logs: the resolved config, metrics.jsonl, and
// the per-step line on stdout.
#pragma once
#include "config.h"
#include <stdio.h>

typedef struct RunLog {
    char dir[1024];
    FILE *metrics;        // metrics.jsonl, one JSON object per line, flushed per line
    double t_start;
    int tty;              // stdout is a terminal: a progress bar is drawn
} RunLog;

double now_seconds(void);
// Creates out_dir/run_name (run_name empty: a name from the date and time), writes config.cfg.
void runlog_open(RunLog *r, const Config *c, const char *command);
void runlog_close(RunLog *r);
// Appends {"step": s, "<k1>": v1, ...} to metrics.jsonl; keys and values as parallel arrays.
void runlog_metrics(RunLog *r, long step, int n, const char *const *keys, const double *vals);
// "12m34s"
const char *format_duration(double seconds, char *buf, size_t n);
// Draws "[#####.....] 45% step 123/456 ETA 1m02s" on a terminal (no-op otherwise).
void runlog_progress(RunLog *r, long step, long total, double seconds_per_step);
