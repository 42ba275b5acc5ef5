// The images of one Stage 2 distillation step at two resolutions (docs/design.md#curriculum resolution
// curriculum; paper App. G.1 multi-resolution distillation).
//
// The loader produces a batch at img_size. The student sees it at the step's resolution: img_size,
// or with multires = r1,r2,... a side drawn per step (a pure function of (seed, step), so a
// resumed run draws the same), the loader's image resized to it. Each teacher sees the same
// augmented image resized to its teacher_img_size (distill_views). Every resize is the
// antialiased separable filter of data/resize.h (PyTorch interpolate(antialias=True)), on the host, per image plane. The
// teacher's taps then come back to the student's grid through teacher_taps_resize.
#pragma once
#include "config.h"
#include "../data/loader.h"
#include "../nn/tape.h"

#define RESOLUTION_MAX 16   // multires sides, curriculum stages

typedef struct ResolutionViews {
    int img_size;                  // the loader's side
    int n_multires;                // 0: the student always sees img_size
    int multires[RESOLUTION_MAX];
    uint64_t seed;
    ResizeFilter filter;           // the config's interpolation
    float *host;                   // resize output (B, C, side, side)
    size_t host_cap;
    ResizeScratch *scratch;        // one per OpenMP thread
    int n_scratch;
} ResolutionViews;

// From c (img_size, multires, interpolation, seed); multires sides must be
// multiples of patch and img_size their largest. 0, or -1 with a message.
int  resolution_views_init_err(ResolutionViews *v, const Config *c, char *err, size_t n);
void resolution_views_free(ResolutionViews *v);
// The student's side at 0-based step: img_size, or the multires draw of that step.
int  resolution_student_side(const ResolutionViews *v, long step);
// A per-channel map of normalized images, x -> x * scale[c] + shift[c]: from the loader's
// normalization (mean_s, std_s) to a teacher's (mean_t, std_t), scale = std_s / std_t and
// shift = (mean_s - mean_t) / std_t.
typedef struct ChannelAffine {
    float scale[3], shift[3];
} ChannelAffine;
ChannelAffine channel_affine_renormalize(const float *mean_s, const float *std_s, const float *mean_t,
                                         const float *std_t, int channels);

// Batch b at side x side as a tensor of t, each channel then mapped by affine (NULL: as the
// loader normalized it). With side = img_size and no affine it is the loader's images, uploaded
// once into *loader_img (NULL before the first view of a batch) and shared by the views.
Tensor *resolution_view(ResolutionViews *v, Tape *t, const Batch *b, int side,
                        const ChannelAffine *affine, Tensor **loader_img);
// images (B, C, h, w) -> out (B, C, h2, w2), every plane through resize_f32 (OpenMP over planes).
void resolution_resize_batch(ResolutionViews *v, const float *images, int B, int C, int h, int w,
                             float *out, int h2, int w2);
