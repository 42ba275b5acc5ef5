// Training checkpoints (docs/design.md#files). A run folder holds one folder per checkpoint:
//
//   RUN/step_00001200/
//     model.safetensors   the weights, timm names and shapes (nn/params_io.h); loads in PyTorch
//     state.safetensors   the training state, also safetensors (inspectable from Python):
//                           m.NAME, v.NAME   AdamW moments, F32, the parameter's own shape
//                           master.NAME      fp32 master weights (when the values are bf16)
//                           ema.NAME         EMA weights, F32 (only when the trainer keeps them;
//                                            from the masters of a bf16 EMA table)
//                           rng              U64 (n, 4): the trainer's RNG states (kernels/rng.h)
//                           cursor           U8 (bytes): the data cursor, opaque to this module
//                         metadata: format = cgspn-train-state, version = 1, step
//     config.cfg          the resolved config (config_print)
//     COMPLETE            written last: "step 1200\n"
//
// Writing is crash-safe: everything goes to RUN/step_00001200.tmp/, every file is fsync'd, then
// COMPLETE, the folder is fsync'd and renamed to its final name, and RUN is fsync'd. A folder
// with a suffix (.tmp, or .old / .del while replacing or pruning) or without COMPLETE is never
// taken for a checkpoint, so a crash or kill at any point leaves the previous checkpoint the
// newest complete one. A write error (a full disk) removes the partial folder and returns an
// error; earlier checkpoints are untouched.
#pragma once
#include "config.h"
#include "../nn/params.h"
#include "../kernels/rng.h"
#include <stdint.h>

#define CKPT_MAX_RNGS   16
#define CKPT_CURSOR_MAX 1024

// What the trainer carries besides parameters and moments.
typedef struct CkptState {
    long step;                         // optimizer steps completed
    int n_rngs;                        // every RNG stream the trainer advances (augmentation, ...)
    Rng rngs[CKPT_MAX_RNGS];
    size_t cursor_bytes;               // the data loader's position (and whatever else the
    uint8_t cursor[CKPT_CURSOR_MAX];   // trainer needs to continue bit-exactly), opaque here
    bool ema_loaded;                   // out of ckpt_load: the checkpoint held EMA weights
    bool optimizer_sharded;            // out of ckpt_load: moments and masters are not in
                                       // state.safetensors but in per-rank shard files
                                       // (dist/ckpt_shard.h); the caller restores them
} CkptState;

typedef struct CkptOptions {
    int keep_last;   // after a save, keep the newest keep_last complete checkpoints; 0 = all
    // Called after each file of the checkpoint is durable (path of the file), and last with the
    // .tmp folder just before the rename. NULL in training; tests use it to die mid-write.
    void (*after_file)(void *user, const char *path);
    void *user;
    // Multi-rank saves (train/data_parallel.h): the .tmp folder was made by ckpt_prepare_err
    // and already holds the ranks' optimizer shards and their SHARDS marker, so it is written
    // into rather than recreated; sharded_state leaves the moments and masters out of
    // state.safetensors (metadata optimizer = sharded).
    bool prepared;
    bool sharded_state;
} CkptOptions;

// "RUN/step_00001200" for a step.
void ckpt_dir_name(const char *run_dir, long step, char *out, size_t n);

// "RUN/step_00001200.tmp": where a checkpoint is written before its rename.
void ckpt_tmp_dir_name(const char *run_dir, long step, char *out, size_t n);
// Creates run_dir (when absent) and an empty RUN/step_NNNNNNNN.tmp (a stale one is removed).
int  ckpt_prepare_err(const char *run_dir, long step, char *tmp, size_t tmp_n, char *err, size_t n);

// Writes a checkpoint of step s->step into run_dir (created when absent). ema may be NULL.
// saved (may be NULL) receives the checkpoint's folder. Returns 0, or -1 with a message; on
// error no partial folder is left and earlier checkpoints are untouched.
int  ckpt_save_err(const char *run_dir, const CkptOptions *o, const Config *c,
                   const ParamTable *params, const ParamTable *ema, Ctx *ctx, const CkptState *s,
                   char *saved, size_t saved_n, char *err, size_t n);
void ckpt_save(const char *run_dir, const CkptOptions *o, const Config *c, const ParamTable *params,
               const ParamTable *ema, Ctx *ctx, const CkptState *s, char *saved, size_t saved_n);

// Steps of the complete checkpoints in run_dir, ascending, into steps (at most max); returns how
// many there are (may exceed max), 0 when run_dir does not exist.
int  ckpt_list(const char *run_dir, long *steps, int max);
// The newest complete checkpoint folder of run_dir into out: 1 found, 0 none.
int  ckpt_find_latest(const char *run_dir, char *out, size_t n);

// The config key resume: "" = no resume (0); "auto" = the newest complete checkpoint of run_dir,
// or none (0) when there is none yet; otherwise a path: a checkpoint folder, or a run folder
// (its newest complete checkpoint). 1 with out set, 0 for none, -1 with a message in err.
int  ckpt_resolve_err(const char *resume, const char *run_dir, char *out, size_t out_n,
                      char *err, size_t n);

// Restores a checkpoint folder: weights into params, moments into params' m and v, master
// weights into params' masters (into the values when the table is fp32), EMA weights
// into ema (when non-NULL and the checkpoint has them: s->ema_loaded), and s. The parameter
// table must describe the same model: a config that changes shapes is refused with a message
// naming the tensor, both shapes and the model keys that differ from the checkpoint's
// config.cfg. Returns 0, or -1 with a message (the tables may then be partly filled).
int  ckpt_load_err(const char *ckpt_dir, const Config *c, ParamTable *params, ParamTable *ema,
                   Ctx *ctx, CkptState *s, char *err, size_t n);
void ckpt_load(const char *ckpt_dir, const Config *c, ParamTable *params, ParamTable *ema, Ctx *ctx,
               CkptState *s);

// The config key init: starting weights for a new run (not a resume; no optimizer state). init
// is a safetensors file, or a checkpoint or run folder (its newest complete checkpoint's
// model.safetensors). Every parameter of params must be in the file with its shape, except those
// whose name starts with optional_prefix (NULL: none; distillation's adaptors), which keep their
// values when absent; file tensors that are not parameters are an error unless they start with
// optional_prefix. Prints "NAME init from PATH: <load report>" to f (may be NULL). 0, or -1.
int  ckpt_load_init_err(const char *init, ParamTable *params, Ctx *ctx, const char *optional_prefix,
                        const char *what, FILE *f, char *err, size_t n);
void ckpt_load_init(const char *init, ParamTable *params, Ctx *ctx, const char *optional_prefix,
                    const char *what, FILE *f);
