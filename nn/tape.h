// Reverse-mode autodiff over a tape (docs/design.md#autodiff). A forward op with gradients enabled appends a
// record (its backward function and what it saved); tape_backward walks the records in reverse
// and each backward accumulates into the .grad of its inputs. With gradients disabled nothing
// is recorded. Activations and records live in the arena, reset every step.
//
// Memory plan: a tensor made while the tape holds n records can only be read by records n and
// later (a record saves what exists when it is appended). So once backward has run record n,
// the tensor and its gradient are dead, and the arena releases them (kernels/arena.h stamps);
// each backward's temporaries are released after it. The peak is the forward's saved
// activations plus one record's backward, not every activation and every gradient at once.
// What a caller reads after backward (an input's gradient, a logged value) must either be read
// before it or be kept with tape_keep. Released bytes are poisoned on the CPU (NaN), so a read
// of a dead tensor shows in the tests.
#pragma once
#include "../kernels/arena.h"

typedef struct Tape Tape;
typedef void (*TapeBackwardFn)(Tape *t, void *record);

typedef struct TapeEntry {
    TapeBackwardFn backward;
    void *record;
} TapeEntry;

// A parameter's gradient is final once backward has run the earliest record that reads the
// parameter (records run in reverse). The tape notes, while recording, the first record each
// parameter feeds (a parameter: an input needing a gradient that already has one before
// backward; activations get theirs only during backward).
typedef struct TapeParamUse {
    int entry;             // index of the record that reads the parameter first
    const Tensor *grad;    // the parameter's gradient tensor (in the parameter table)
} TapeParamUse;

// Called by tape_backward once a parameter's gradient is final for this backward (the data-
// parallel trainer launches its gradient bucket's all-reduce from here: dist/grads.h).
typedef void (*TapeParamDoneFn)(void *user, const Tensor *grad);

struct Tape {
    Ctx *ctx;
    Arena *arena;
    TapeEntry *entries;
    int n, cap;
    bool grad_enabled;
    TapeParamUse *uses;    // in recording order (ascending entry)
    int n_uses, cap_uses;
    const Tensor **seen;   // open-addressing set of the parameters in uses (cap_seen slots)
    int cap_seen;
    TapeParamDoneFn param_done;   // NULL: no reports
    void *param_done_user;
    void *one;             // 1.0f on the device, backward's seed: a copy, not an upload, so a
                           // backward can be captured as a graph (made by the first backward)
};

void tape_init(Tape *t, Ctx *ctx, Arena *arena);
void tape_free(Tape *t);
// Drops all records and resets the arena (every activation of the step is released).
void tape_reset(Tape *t);
// Returns the previous setting.
bool tape_set_grad_enabled(Tape *t, bool enabled);

// x (and its gradient, when backward makes one) lives until the reset, not only until its last
// reader's backward: for what the caller reads after backward.
void tape_keep(Tape *t, const Tensor *x);
// x's storage is free for reuse now (x made by the caller, read by no record).
void tape_release(Tape *t, const Tensor *x);

// Activation checkpointing (timm's set_grad_checkpointing): fn runs a piece of the forward from
// x and sets outs[0..n_out-1] (an entry may stay NULL). tape_checkpoint runs it, keeps only x and
// the outputs, and records one entry whose backward runs fn again from x with gradients on and
// backpropagates through that. fn must be a pure function of (arg, x) and the parameters: the
// recomputation gives the same bits, so gradients are bitwise those of the plain forward.
// arg (arg_bytes) is copied. Without gradients fn just runs.
#define TAPE_SEGMENT_MAX_OUTS 4
typedef void (*TapeSegmentFn)(Tape *t, const void *arg, Tensor *x, Tensor **outs);
void tape_checkpoint(Tape *t, TapeSegmentFn fn, const void *arg, size_t arg_bytes, Tensor *x,
                     int n_out, Tensor **outs);

// A new activation of the context's dtype (fp32 when f32) on the context's device.
Tensor *tape_tensor(Tape *t, int ndim, const int *shape, bool f32);
Tensor *tape_tensor_like(Tape *t, const Tensor *x);
// Marks out as needing a gradient when recording and any input does; returns whether it does.
bool tape_track(Tape *t, Tensor *out, const Tensor *a, const Tensor *b, const Tensor *c);
// Whether an op on a, b, c (any may be NULL) would be recorded: tape_track's answer, asked before
// the op runs (an op that fuses what no backward needs when nothing is recorded).
bool tape_would_track(const Tape *t, const Tensor *a, const Tensor *b, const Tensor *c);
// Appends a record of `bytes` zeroed host bytes for fn and returns it for the op to fill.
void *tape_record(Tape *t, TapeBackwardFn fn, size_t bytes);
// x's gradient (zeroed on first use) when x needs one, else NULL.
Tensor *tape_grad(Tape *t, Tensor *x);
// For a backward that can WRITE its result: x's gradient when x needs one, else NULL. When this
// call creates it, it is left unzeroed and *fresh is set (the caller must overwrite every
// element); otherwise *fresh is cleared and the caller adds, as usual.
Tensor *tape_grad_fresh(Tape *t, Tensor *x, bool *fresh);
// The backward of an identity (a residual add, a view): when x needs a gradient, has none yet
// and g has x's dtype and size, x's gradient becomes g itself (seen with x's shape), so nothing
// is zeroed or copied; returns whether it did (otherwise the caller adds g in). g must be the
// gradient of the op's output, which no record reads after this one: records run in reverse,
// so every reader of the output's gradient has already run. A residual add lets both inputs
// adopt g: in x + f(x), f's backward gets dx == its dy, so a backward that reads other elements
// of dy than the one it writes (a convolution's taps) must write elsewhere first (nn_dwconv).
bool tape_grad_adopt(Tape *t, Tensor *x, Tensor *g);
// Reports every parameter whose gradient is final during the next tape_backward(_from) calls
// (fn NULL: none). Set it for the last backward of a step only (gradient accumulation adds
// more to every gradient in later backwards).
void tape_set_param_done(Tape *t, TapeParamDoneFn fn, void *user);
// Seeds dloss = 1 (loss is a 1-element tensor) and runs every record backwards.
void tape_backward(Tape *t, Tensor *loss);
// Like torch.autograd.backward(outs, grads): adds grads[i] into outs[i]'s gradient, then runs
// every record backwards. grads[i] has outs[i]'s shape and dtype.
void tape_backward_from(Tape *t, int n, Tensor **outs, Tensor **grads);
// Like tape_backward_from, but a grads[i] with outs[i]'s dtype and size becomes outs[i]'s gradient
// buffer itself (no copy), as torch's backward(grad) reads its argument in place: backward may
// then write into it, so the caller's values are lost (refill it before reusing it).
void tape_backward_from_consume(Tape *t, int n, Tensor **outs, Tensor **grads);
