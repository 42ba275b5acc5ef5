// `cgspn bench vit` and `cgspn bench block` (bench/bench_model.c): whole training steps and single
// so14-width blocks on the GPU, beside PyTorch's numbers from the same device run
// (bench/bench_timm.py writes build/bench_timm.json; `make bench` runs it first).
#pragma once
#include <stdio.h>

// ViT-B/16 at 224 px (batch 256) and the so14 ViT at 378 px (batch 32), bf16: step time
// (forward + cross-entropy + backward + AdamW with global-norm clipping), img/s, MFU, peak GPU
// memory (device_memory_use), each with grad_checkpoint 0 and 1; the ratios to timm eager and
// torch.compile (with and without gradient checkpointing), img/s and memory; a per-op profile of
// one ViT-B/16 step.
int bench_vit_run(FILE *out);
// The fast GSPN classifiers gspn_t/s/b (configs/gspn_*.cfg) at 224 px, batch 128, bf16: training
// step and inference img/s beside timm's convnext, swin and deit peers (eager and compiled,
// bench_timm.py --only classify), each gspn model's ratios to its convnext peer compiled, the
// step's ms per GMAC of each and their spread; a per-op profile of one training step of each
// (time, GB/s over the ops' tensor bytes, percent of the copy bandwidth).
int bench_classify_run(FILE *out);
// `cgspn bench classify` with options: only, when set, the one model of that label (gspn_t, gspn_s
// or gspn_b) with its peer's ratios and no spread; model (a label) read from config instead of
// configs/<label>.cfg (its label and peer kept, and the file named in the output).
typedef struct ClassifyOptions {
    const char *only, *model, *config;
} ClassifyOptions;
int bench_classify(FILE *out, const ClassifyOptions *o);
// Parses `--only=LABEL` and `--config=LABEL:PATH` from argv[first..] and runs bench_classify.
int bench_classify_cmd(int argc, char **argv, int first);
// One so14-width block (B = 32, C = 1152, MLP 4304) at 1036 px (74x74 tokens) and 2058 px
// (147x147): C-GSPN (Cc = 64) against cgspn's attention block and timm's SDPA block (compiled).
int bench_block_run(FILE *out);
// One resolution-curriculum Stage-k step (bench/bench_curriculum.c): the so14 student at 1036 px
// with its 756 px C-GSPN teacher (taps upsampled), batches 1 and 4, on the GPU; a tiny case on a
// CPU. img/s, step time, the host resize of the teacher's image, activation memory.
int bench_curriculum_run(FILE *out);
