// `cgspn distill`: Stage 1 (sublayer alignment) and Stage 2 (dual-tap MSE + KL with adaptors)
// distillation of a C-GSPN or hybrid student from a frozen teacher (docs/design.md#losses).
//
// Stage 1: the teacher runs once; for every C-GSPN block i of the student,
//   F_s = gspn_i(norm1_s(h_t(i-1))) on the patch tokens of the teacher's block input as an
//   (H, W) grid, F_t = the teacher's attention output (PP tap, patch tokens);
//   loss = mean over those blocks of MSE(F_s, F_t). Only the C-GSPN layers train by default
//   (stage1_train = gspn_norm1 adds norm1); nothing flows between blocks.
// Stage 2: full student forward; at each tapped block (taps), PP and PB of student and teacher
//   on patch tokens; per tap L = MSE(A(v_s), v_t) + lambda KL(P(A(v_s)) || P(v_t)), A an
//   adaptor (nn/adaptor.h, or the identity with adaptors = 0); total = alpha mean(L_PP) +
//   beta mean(L_PB) (+ gamma CE through the student's head) (+ summary_weight MSE(A(pool_s),
//   summary_t), RADIO's summary loss: the student's pooled vector through an adaptor against
//   the teacher's class token or fc_norm mean). Adaptors are parameters named
//   adaptors.N.pp.* / adaptors.N.pb.* (N the 0-based block) and adaptors.summary.*, saved in
//   checkpoints and dropped by `cgspn export`.
#pragma once
#include "classify.h"
#include "resolution.h"
#include "teacher.h"
#include "../nn/adaptor.h"

int cmd_distill(int argc, char **argv);

#define DISTILL_MAX_PARTS (2 * ENCODER_MAX_DEPTH + 6)   // of all teachers together
#define DISTILL_PART_NAME 16
#define DISTILL_MAX_TEACHERS 4
#define ADAPTOR_PREFIX "adaptors."

// PHI-S standardization of one teacher feature (docs/design.md#losses): y = (x + shift) * scale per
// channel, shift = -mean and scale = 1 / sqrt(trace(cov) / C) in every channel. PHI-S rotates
// by PCA then Hadamard before its isotropic scale; both rotations are orthogonal, so the MSE is
// the same without them, and the KL term sees the channels as the teacher has them. The two are
// parameters of the run (PREFIX.phi_s.shift / .scale, (C), never trained), so checkpoints carry
// them and a resumed run uses the same values.
typedef struct PhiS {
    Tensor *shift, *scale;   // NULL: not standardized
} PhiS;

// One teacher of a Stage 2 run (Stage 1: the only one, its taps the aligned blocks) and what
// the student learns from it. Teacher k (0-based) reads its keys from the run config (k = 0) or
// from its teacher file (extra_teachers) on top of the run config.
typedef struct DistillTeacher {
    Teacher teacher;
    char file[CONFIG_STR_MAX];          // its teacher file; "" for the run config's teacher
    char label[8];                      // "" for teacher 1, "t2." ... before its parts' names
    int n_taps;                         // Stage 1: aligned (C-GSPN) blocks; Stage 2: tapped blocks
    int taps[ENCODER_MAX_DEPTH];        // the student's blocks, 0-based, ascending
    int teacher_blocks[ENCODER_MAX_DEPTH];   // the teacher's block paired with each (0-based)
    bool tap_pp, tap_pb, use_adaptors;
    Adaptor ad_pp[ENCODER_MAX_DEPTH], ad_pb[ENCODER_MAX_DEPTH];   // by tap index
    float alpha, beta, lambda1, lambda2, summary_weight;
    bool trains_summary;                // summary_weight > 0: the pooled student, through
    Adaptor ad_summary;                 // ad_summary, against the teacher's summary
    int side;                           // the side of the square image it sees
    bool have_norm;                     // teacher_mean / teacher_std set: its input is renormalized
    float mean[3], std[3];
    ChannelAffine affine;               // the student's normalization -> mean, std (have_norm)
    bool phi_s;                         // its taps and summary standardized
    PhiS phi_pp[ENCODER_MAX_DEPTH], phi_pb[ENCODER_MAX_DEPTH], phi_summary;
    int raw_first;                      // its first value in the raw loss vector
} DistillTeacher;

typedef struct Distiller {
    int stage;
    Ctx *ctx;
    Encoder student;
    ParamTable params;               // the student, then each teacher's adaptors (Stage 2)
    int n_teachers;                  // Stage 1: 1
    DistillTeacher teachers[DISTILL_MAX_TEACHERS];
    float gamma;
    bool trains_head;                // gamma > 0: CE through norm and head
    // The loss parts a step reports (host, from the device vector distill_loss fills):
    // Stage 1: mse_bK per aligned block (K 1-based); Stage 2, per teacher (its label before the
    // names): pp_bK and pb_bK per tap (L_PP, L_PB, K the student's block), then mse_pp, kl_pp,
    // mse_pb, kl_pb (means over taps), ce after the first teacher's when gamma > 0, summary when
    // its summary_weight > 0.
    int n_parts;
    char part_names[DISTILL_MAX_PARTS][DISTILL_PART_NAME];
    int n_raw;                       // values of the device vector (see distill_parts)
    int raw_ce;                      // where ce is in it
} Distiller;

// Builds the teacher (loaded) and the student (+ adaptors) of config c, parameters allocated
// and initialized fresh from c->seed, trainable flags set for the stage; the student's
// weights from the teacher or c->init come from distiller_init_student.
int  distiller_init_err(Distiller *d, const Config *c, Ctx *ctx, char *err, size_t n);
void distiller_init(Distiller *d, const Config *c, Ctx *ctx);
// The same with d->teacher already built by the caller (the rest of d zeroed): benchmarks give
// it fresh weights (teacher_init_fresh). On error the teacher is freed.
int  distiller_init_with_teacher_err(Distiller *d, const Config *c, Ctx *ctx, char *err, size_t n);
void distiller_free(Distiller *d);
// The student's starting weights (not on resume): c->init's (a checkpoint or run folder, or a
// safetensors file; adaptors may be absent and stay fresh), else copied from the teacher when
// c->copy_teacher (printing the copy report to f, may be NULL).
void distiller_init_student(Distiller *d, const Config *c, FILE *f);

// The step's loss on img (B, in_chans, H, W) and, when gamma > 0, soft targets (B, K) (else
// NULL). Records the student on t (the teacher runs on t's arena without records, each block's
// activations released when it is done; its kept taps live until the student's backward). *raw receives a device fp32 vector of d->n_raw values: the loss terms of the step
// (distill_parts turns them into the logged parts) and last the total.
Tensor *distill_loss(Distiller *d, Tape *t, Tensor *img, Tensor *targets, Tensor **raw);
// The same with teacher k seeing teacher_imgs[k] (B, in_chans, h, w), the student's image at
// the teacher's resolution and normalization (train/resolution.h), its taps bilinearly resized
// to the student's grid (teacher_taps_resize): Stage 2 of the resolution curriculum, of multires
// and of several teachers. distill_loss is every teacher_imgs[k] = img.
Tensor *distill_loss_views(Distiller *d, Tape *t, Tensor *img, Tensor *const *teacher_imgs,
                           Tensor *targets, Tensor **raw);
// Each teacher's input map from the student's normalization (the loader's mean, std per channel)
// to its teacher_mean / teacher_std; teachers without them see the student's normalization.
void distill_set_normalization(Distiller *d, const float *mean, const float *std);
// Batch b as the student's image at `side` (*student) and as each teacher's, at its side and in
// its normalization (teachers[k], d->n_teachers of them); shared where they agree.
void distill_views(Distiller *d, ResolutionViews *v, Tape *t, const Batch *b, int side,
                   Tensor **student, Tensor **teachers);
// Teacher dt on its view (B, in_chans, side, side): its taps the student's pairs ask for, resized
// to the student's grid, and its summary when trained on, not standardized (tt, on t's arena).
void distill_teacher_targets(DistillTeacher *dt, Tape *t, Tensor *view, const Encoder *student,
                             TeacherTaps *tt);
// PHI-S (phi_s): each standardized teacher's statistics (its taps and summary as the loss sees
// them) over `batches` batches of l, this rank's slices, averaged across ranks through dp, written
// into its PhiS parameters (the student's grid at img_size); a line per teacher to f (may be NULL).
// Runs on its own arena. Not on resume: the checkpoint holds the values.
void distill_phi_s_gather(Distiller *d, Loader *l, ResolutionViews *v, struct DataParallel *dp,
                          int batches, FILE *f);

// One Stage 2 tap: MSE(A(vs), vt) + lambda KL(P(A(vs)) || P(vt)), A = a or the identity
// (a NULL); vs, vt (B, N, C) patch tokens. raw (may be NULL): raw[k], raw[k+1] = the MSE, the KL.
Tensor *distill_tap_loss(Tape *t, const Adaptor *a, Tensor *vs, Tensor *vt, float lambda,
                         Tensor *raw, int k);
// The logged parts (d->n_parts values, see part_names) from the downloaded raw vector.
void distill_parts(const Distiller *d, const float *raw, float *parts);

// Parses taps ("9,18,27" 1-based, "every 9" / "every=9", "all") for a depth: blocks[] 0-based,
// ascending; returns the count, or -1 with a message.
int distill_parse_taps(const char *s, int depth, int *blocks, char *err, size_t n);

typedef struct DistillOptions {
    long stop_after;      // as TrainOptions (classify.h): stop after this step with a checkpoint
    float *step_losses;   // one float per step of the run, or NULL
    long nonfinite_at;    // test hook, as TrainOptions: this 1-based step's student images are
                          // multiplied by NaN (0 = never)
    struct Dist *dist;    // the process group (NULL: dist_process(); see TrainOptions)
} DistillOptions;

// One distillation run of config c on the shards of c->data_shards, read as cgspn train reads
// them (data/loader.h: train_split with the config's augmentation, val_split for evaluation):
// teacher, student, resume (bit-exactly) per c->resume, AdamW + warmup/cosine over the
// trainable parameters, logs with every part, evaluation of the student's head when it has
// one; checkpoints, signals and on_nonfinite as cgspn train (the loop of train/loop.h). o may be
// NULL.
TrainResult distill_train(const Config *c, const DistillOptions *o);
