// What an encoder is (nn/encoder.h builds it; nn/hier.h the hierarchical kind): its kind and
// configuration, the stochastic-depth settings, and the rules every kind shares: the output
// width, which blocks attend, the drop-path schedule.
#pragma once
#include "tape.h"
#include "../kernels/ops.h"
#include <stdbool.h>
#include <stdint.h>

typedef enum { ENCODER_VIT = 0, ENCODER_CGSPN = 1, ENCODER_HYBRID = 2, ENCODER_GSPN_HIER = 3 } EncoderKind;

#define ENCODER_MAX_DEPTH 64
#define HIER_STAGES 4   // gspn_hier: stages of the hierarchy (nn/hier.h)

typedef struct EncoderConfig {
    EncoderKind kind;
    int img_h, img_w, in_chans, patch;
    int width, depth, heads, mlp_hidden;
    GeluKind gelu;
    float ln_eps;
    int class_token;          // ViT: prepend a learned class token
    int reg_tokens;           // ViT: learned register tokens after it (timm reg_token (1,R,C))
    int pos_embed;            // ViT: learned absolute position embedding
    int no_embed_class;       // pos_embed covers the patch tokens only, added before the prefix
                              // tokens are prepended (timm no_embed_class)
    int norm_pre;             // LayerNorm on the tokens before the first block (timm norm_pre);
                              // the patch embedding then has no bias, as timm's pre_norm ViT
    int avg_pool;             // head on the mean of patch tokens (else on the class token)
    int fc_norm;              // the pooled vector is normed (fc_norm) and the tokens are not (timm
                              // fc_norm: its final norm is the identity)
    int map_pool;             // the pooled vector is timm's AttentionPoolLatent of every token
                              // (global_pool = map: SigLIP's MAP head), forward only
    float layer_scale_init;   // 0 = no layer scale
    int qkv_bias;
    int num_classes;          // 0 = no head (feature extractor, teacher)
    int gspn_latent;          // C-GSPN latent channels Cc
    int gspn_shared_w, gspn_out_norm;
    int attn_every;           // hybrid: blocks attn_every, 2*attn_every, ... (1-based) attend
    int grad_checkpoint;      // 0 = off; N: blocks 0, N, 2N, ... recompute their forward in backward
    int mlp_keep_hidden;      // the blocks' MLPs keep gelu(fc1(x)) for backward (else make it again)
    // gspn_hier (nn/hier.h): width is the first stage's, depth the sum of depths, patch 4 (the
    // stem's stride); mlp_hidden unused (mlp_ratio per stage).
    int depths[HIER_STAGES];
    float mlp_ratio, mixer_ratio;
    int mixer_conv;
} EncoderConfig;

// Stochastic depth (timm drop_path_rate): block i's two residual branches (mixing layer, MLP)
// are dropped per sample with probability rate * i / (depth - 1), linear over depth from 0 at
// the first block, as timm's linspace. Applied only while the tape records gradients; the
// trainer sets step (and first_sample under data parallelism) before each forward. The masks
// are a pure function of (seed, step, 2 * block + branch, sample) (kernels/drop_path_mask.h).
typedef struct EncoderDropPath {
    float rate;            // 0 = off (the default)
    uint64_t seed;
    int64_t step;
    int first_sample;
    const int64_t *step_at;   // NULL, or the step's place on the device (DropPathArgs.step_at)
} EncoderDropPath;

// Width of the tokens encoder_forward returns and of encoder_pool's vector: width, or a
// hierarchical encoder's last stage's.
int encoder_out_width(const EncoderConfig *cfg);
// "vit", "cgspn", "hybrid" or "gspn_hier"
const char *encoder_kind_name(EncoderKind kind);
// Whether block i (0-based) is an attention block for this encoder.
int encoder_block_is_attention(const EncoderConfig *cfg, int i);
// Whether stochastic depth drops anything now: d->rate > 0, depth >= 2, the tape recording
// gradients.
bool encoder_drop_active(const Tape *t, const EncoderDropPath *d, int depth);
// x itself, or with stochastic depth active (encoder_drop_active) the residual branch x of block i (0-based; branch 0: mixing layer, 1: MLP) dropped
// per sample with probability rate * i / (depth - 1).
Tensor *encoder_drop_branch(Tape *t, const EncoderDropPath *d, int depth, int i, int branch,
                            Tensor *x);
