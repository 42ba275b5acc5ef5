// `cgspn data SUBCOMMAND`: build, inspect, verify, bench, synth (data/README.md).
#pragma once
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

int cmd_data(int argc, char **argv);

// The subcommands; argv[0] is the subcommand's name.
int data_build_main(int argc, char **argv);     // train/data_cmd.c
int data_verify_main(int argc, char **argv);    // train/data_cmd.c
int data_inspect_main(int argc, char **argv);   // train/data_inspect.c
int data_bench_main(int argc, char **argv);     // bench/data_bench.c
int data_synth_main(int argc, char **argv);     // bench/data_bench.c
// `cgspn data bench` with its defaults (synthetic 224 px JPEGs, full augmentation), in the
// form of bench/bench.c's table: {"data", data_bench_run, "loader img/s at 224 px"}.
int data_bench_run(FILE *out);

// Writes count synthetic images (smooth colour fields, shapes and noise, sizes around
// height x width) as an ImageFolder tree root/class_K/NNNNNN.jpg|png. Returns 0 or -1 (err).
int data_synth_folder(const char *root, int count, int classes, int height, int width,
                      int png, uint64_t seed, char *err, size_t n);
