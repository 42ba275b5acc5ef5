// The frozen teacher of `cgspn distill` (docs/design.md#stage1, docs/design.md#files) and the student's start from it.
//
// A teacher is any encoder of this codebase (a ViT for Stage 1/2) described by its own config
// file (its model keys) and loaded from safetensors: a cgspn checkpoint, or a timm / OpenCLIP
// ViT converted to safetensors (timm names; teacher_prefix is stripped, e.g. visual.trunk.).
// It runs at the run's image size: a pos_embed made for another grid is resampled as timm's
// resample_abs_pos_embed does. Its parameters are values only (no gradients or optimizer
// state; bf16 on the GPU), and it runs block by block with gradients off on the step's arena,
// each block's activations released when it is done, so only the taps asked for outlive a block.
#pragma once
#include "config.h"
#include "../nn/encoder.h"
#include "../nn/params_io.h"

typedef struct Teacher {
    Config cfg;              // the teacher's config (img_size set to the run's)
    Encoder enc;
    ParamTable params;       // frozen
    char weights[1024];      // the safetensors file loaded
    char config_path[1024];  // the config file its model keys came from
    LoadReport report;       // of the load (extra tensors, pos_embed resampling)
} Teacher;

// Resolves c->teacher (a safetensors file, or a checkpoint / run folder: its newest complete
// checkpoint's model.safetensors) and c->teacher_config (empty: the config.cfg beside a teacher
// checkpoint), builds the teacher at c's img_size and loads it strictly (every parameter must
// be in the file with its shape; extra tensors are listed). 0, or -1 with a message.
// c->teacher = TEACHER_RANDOM builds teacher_config's model with weights initialized from
// c->seed instead (benchmarks).
#define TEACHER_RANDOM "random"
int  teacher_load_err(Teacher *T, const Config *c, Ctx *ctx, char *err, size_t n);
void teacher_load(Teacher *T, const Config *c, Ctx *ctx);
// The side of the square images the teacher of run config c sees: teacher_img_size, or img_size.
int  teacher_image_side(const Config *c);
// A teacher with freshly initialized weights (seed) of the model keys of `model`, at image side
// `side` (benchmarks: the speed of a step does not depend on the teacher's values).
void teacher_init_fresh(Teacher *T, const Config *model, int side, Ctx *ctx, uint64_t seed);
void teacher_free(Teacher *T, Ctx *ctx);
// "teacher: vit, 4 blocks, ... from PATH (config CFG)" and the load report.
void teacher_describe(const Teacher *T, FILE *f);

// What the teacher keeps per block i (0-based), patch tokens only (class and register tokens
// dropped), as (B, H*W, C) tensors on the caller's tape's arena: in = the block's input h_t(i-1)
// (fp32 residual stream; for i = 0 the tokens after pos_embed), pp = the mixing layer's output
// before the residual add (activation dtype), pb = the block's output (fp32); and summary, the
// teacher's summary vector (B, C) fp32 after every block: encoder_pool of its final tokens (the
// class token, or the mean of the patch tokens, fc_norm'ed when the model has it).
typedef struct TeacherTaps {
    Tensor *in[ENCODER_MAX_DEPTH], *pp[ENCODER_MAX_DEPTH], *pb[ENCODER_MAX_DEPTH];
    Tensor *summary;
} TeacherTaps;
typedef struct TeacherWant {
    bool in[ENCODER_MAX_DEPTH], pp[ENCODER_MAX_DEPTH], pb[ENCODER_MAX_DEPTH];
    bool summary;
} TeacherWant;

// Runs the teacher on img (B, in_chans, H, W) up to the last block a wanted tap needs; the
// taps not wanted are NULL. Nothing is recorded on keep (the kept tensors need no gradient).
void teacher_forward(Teacher *T, Tape *keep, Tensor *img, const TeacherWant *want,
                     TeacherTaps *out);

// Every tap of tt on the teacher's (h, w) grid, (B, h*w, C), replaced by its bilinear resize
// (kernels/ops.h resize_bilinear: half-pixel centres, PyTorch interpolate(align_corners=False))
// to (B, grid_h*grid_w, C), on keep's arena, dtype kept; nothing when the grids agree. The
// resolution curriculum's Up(): a low-resolution teacher's features on the student's grid.
void teacher_taps_resize(Tape *keep, const Teacher *T, TeacherTaps *tt, int grid_h, int grid_w);

// Student init from the teacher: every student parameter with a teacher parameter of the same
// name and shape takes its values (patch embed, norms, MLPs, layer scales, head, and a hybrid's
// attention blocks); the others keep theirs (C-GSPN layers stay fresh). Parameters whose name
// starts with skip_prefix (NULL: none; the adaptors of distillation) are left out of the report.
typedef struct CopyReport {
    int n_copied, n_kept;
    size_t values_copied;
    char **copied;           // student names copied
    char **kept;             // student names not copied, each "NAME (why)"
} CopyReport;
void student_copy_from_teacher(ParamTable *student, const ParamTable *teacher, Ctx *ctx,
                               const char *skip_prefix, CopyReport *r);
// Two lines: what was copied and what was not, names with block numbers folded ("blocks.*").
void copy_report_print(const CopyReport *r, FILE *f);
void copy_report_free(CopyReport *r);
