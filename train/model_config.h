// Config keys -> the encoder description, shared by every command.
#pragma once
#include "config.h"
#include "../nn/encoder.h"

EncoderConfig encoder_config_from(const Config *c);
// One line: "vit: 4 blocks, width 64, 7x7 tokens, 0.21 M parameters".
// The prefix tokens as the model lines print them: " + class token + 4 registers", or "".
const char *encoder_prefix_text(const Encoder *e, char *buf, size_t n);
void encoder_describe(const Encoder *e, const ParamTable *t, FILE *f);
