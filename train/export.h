// `cgspn export CKPT --out student.safetensors [--ema]`: the deployable student of a checkpoint.
#pragma once
#include <stdbool.h>
#include <stddef.h>

int cmd_export(int argc, char **argv);

// Writes the tensors of ckpt's weights to out, without the distillation adaptors (names
// adaptors.*); optimizer state (state.safetensors) is never read. ckpt is a checkpoint folder,
// a run folder (its newest complete checkpoint) or a safetensors file. Tensors keep their
// names, shapes and dtypes (bytes copied as they are). ema: each tensor's EMA instead (ema.NAME
// of the checkpoint's state.safetensors, fp32; ckpt must be a folder). *kept / *dropped (may be
// NULL) receive the counts. 0, or -1 with a message.
int export_student_err(const char *ckpt, const char *out, bool ema, int *kept, int *dropped,
                       char *err, size_t n);
