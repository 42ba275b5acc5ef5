// `cgspn data SUBCOMMAND`: build, inspect, verify, bench, synth (data/README.md).
#pragma once
#include <stddef.h>
#include <stdint.h>

int cmd_data(int argc, char **argv);

// The subcommands; argv[0] is the subcommand's name.
int data_build_main(int argc, char **argv);     // train/data_cmd.c
int data_verify_main(int argc, char **argv);    // train/data_cmd.c
int data_inspect_main(int argc, char **argv);   // train/data_inspect.c
int data_bench_main(int argc, char **argv);     // train/data_bench.c
int data_synth_main(int argc, char **argv);     // train/data_bench.c

// Writes count synthetic images (smooth colour fields, shapes and noise, sizes around
// height x width) as an ImageFolder tree root/class_K/NNNNNN.jpg|png. Returns 0 or -1 (err).
int data_synth_folder(const char *root, int count, int classes, int height, int width,
                      int png, uint64_t seed, char *err, size_t n);
