// `cgspn features`: runs an encoder on given images and writes every block's PP and PB taps,
// the final-norm tokens and (with a head) the logits; optionally parameter gradients of a probe
// loss, for parity checks against PyTorch (tests/parity_timm.py).
#pragma once
int cmd_features(int argc, char **argv);
