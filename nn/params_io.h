// The parameter table to and from safetensors weight files (docs/design.md#files): timm names, PyTorch's
// layouts, so weights move between cgspn and PyTorch (safetensors.torch.load_file / save_file).
//
// Shapes in files. We keep a few parameters in fewer dimensions than timm does; a file may hold
// either form, and we write timm's:
//   pos_embed, cls_token, reg_token   ours (N, C) and (1, C), timm's (1, N, C) and (1, 1, C):
//                                     written with leading 1s up to 3 dims; leading 1s are
//                                     ignored on load (both forms load).
//   conv weights                      ours are 4-D (D, C, p, p) like PyTorch's; a flattened
//                                     2-D (D, C*p*p) tensor (the same bytes) also loads.
// Dtypes: F32, BF16, F16 and F64 tensors load into any parameter (converted; bf16 values are
// rounded and their fp32 masters take the file's values); parameters are written in their own
// dtype (F32, or BF16 for bf16 parameters; their masters go into checkpoints' state).
#pragma once
#include "params.h"
#include "safetensors.h"
#include <stdio.h>

typedef struct LoadReport {
    bool allow_missing;   // in: a parameter the file lacks keeps its value and is listed in
                          //     missing (partial init) instead of being an error
    int pos_grid_h, pos_grid_w;   // in: when > 0, a file pos_embed made for another token grid is
                          //     resampled to this one as timm's resample_abs_pos_embed does
                          //     (nn/resample.h: bicubic, antialiased when shrinking); the
                          //     parameter's tokens beyond grid_h*grid_w are prefix (class)
                          //     tokens, copied as they are; the file's grid must be square
    int pos_from_h, pos_from_w;   // out: the file's grid when pos_embed was resampled, else 0
    int n_loaded;         // out: parameters filled from the file
    int n_missing;        // out: parameters the file lacks (table names)
    char **missing;
    int n_extra;          // out: file tensors no parameter took (file names)
    char **extra;
} LoadReport;

// Fills every parameter from the tensor of the same name in the file at path, after removing
// strip_prefix (NULL or "" = none; e.g. OpenCLIP's "visual.trunk." for a timm trunk, "visual."
// for its own ViT) from the file's names; file tensors without the prefix are extras. A name is
// timm's, or OpenCLIP's own for a ViT image tower (conv1, class_embedding, positional_embedding,
// ln_pre, transformer.resblocks.N.{ln_1, attn.in_proj_*, attn.out_proj, ln_2, mlp.c_fc,
// mlp.c_proj, ls_1, ls_2}, ln_post; its "proj" stays extra). Shapes must match (up to the forms above): a mismatch
// is an error naming the tensor and both shapes; missing parameters are an error naming them
// unless r->allow_missing; extra tensors are listed in r, never an error. Everything is checked
// before any parameter changes, so on error the table is untouched. r may be NULL (strict).
int  params_load_safetensors_err(ParamTable *t, Ctx *ctx, const char *path,
                                 const char *strip_prefix, LoadReport *r, char *err, size_t n);
void params_load_safetensors(ParamTable *t, Ctx *ctx, const char *path, const char *strip_prefix,
                             LoadReport *r);
// "loaded 12 parameters (pos_embed resampled from 14x14 to 27x27); 2 missing (kept their values): head.weight, head.bias; 1 extra ..."
void load_report_print(const LoadReport *r, FILE *f);
void load_report_free(LoadReport *r);

// Writes every parameter (trainable or not) under its name, with metadata pairs (may be NULL),
// to path (through path.tmp, fsync'd, renamed).
int  params_save_safetensors_err(const ParamTable *t, Ctx *ctx, const char *path,
                                 const StMeta *meta, int n_meta, char *err, size_t n);
void params_save_safetensors(const ParamTable *t, Ctx *ctx, const char *path, const StMeta *meta,
                             int n_meta);

// The shape parameter p is written with (timm's form, see above); returns ndim.
int  params_file_shape(const Param *p, int64_t *shape);
// Whether file tensor f can fill a parameter of shape p (same shape up to the forms above).
bool params_shape_matches(const Tensor *p, const StTensor *f);
