// `cgspn export CKPT --out student.safetensors`: the deployable student of a checkpoint.
#pragma once
#include <stddef.h>

int cmd_export(int argc, char **argv);

// Writes the tensors of ckpt's weights to out, without the distillation adaptors (names
// adaptors.*); optimizer state (state.safetensors) is never read. ckpt is a checkpoint folder,
// a run folder (its newest complete checkpoint) or a safetensors file. Tensors keep their
// names, shapes and dtypes (bytes copied as they are). *kept / *dropped (may be NULL) receive
// the counts. 0, or -1 with a message.
int export_student_err(const char *ckpt, const char *out, int *kept, int *dropped, char *err,
                       size_t n);
