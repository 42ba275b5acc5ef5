// Encoders of DESIGN §4: ViT (timm semantics), C-GSPN (no pos_embed, no class token), the
// hybrid (attention every k-th block), and the hierarchical GSPN classifier (nn/hier.h). Tokens
// are channels-last: (B, prefix + H*W, C).
#pragma once
#include "layers.h"
#include "hier.h"

typedef enum { ENCODER_VIT = 0, ENCODER_CGSPN = 1, ENCODER_HYBRID = 2, ENCODER_GSPN_HIER = 3 } EncoderKind;

#define ENCODER_MAX_DEPTH 64

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
    // gspn_hier (nn/hier.h): width is the first stage's, depth the sum of depths, patch 4 (the
    // stem's stride); mlp_hidden unused (mlp_ratio per stage).
    int depths[HIER_STAGES];
    float mlp_ratio, mixer_ratio;
    int mixer_conv;
} EncoderConfig;

// timm's AttentionPoolLatent with one latent (attn_pool.*): q = latent Wq + bq (C), k | v =
// tokens Wkv + bkv, x = proj(attention(q, k, v)), pooled = x + mlp(norm(x)).
typedef struct MapPool {
    Tensor *latent;           // (1, C), file (1, 1, C)
    Linear q, kv, proj;
    LayerNorm norm;
    Mlp mlp;
} MapPool;

typedef struct Block {
    LayerNorm norm1, norm2;
    int is_attention;
    Attention attn;
    CgspnLayer gspn;
    Mlp mlp;
    Tensor *ls1, *ls2;        // layer scale gammas or NULL
} Block;

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
} EncoderDropPath;

typedef struct Encoder {
    EncoderConfig cfg;
    EncoderDropPath drop_path;
    int grid_h, grid_w, prefix;   // token grid and number of prefix tokens (class + registers)
    Linear patch_embed;           // w (width, in_chans, patch, patch): PyTorch's conv weight
    Tensor *cls_token;            // (1, width) or NULL
    Tensor *reg_token;            // (reg_tokens, width) or NULL
    Tensor *pos_embed;            // (prefix + grid_h*grid_w, width), (grid_h*grid_w, width) with
                                  // no_embed_class, or NULL
    LayerNorm norm_pre;           // when cfg.norm_pre
    Block blocks[ENCODER_MAX_DEPTH];
    LayerNorm norm;               // the tokens' final norm, or with cfg.fc_norm the pooled vector's
    MapPool map;                  // when cfg.map_pool
    Linear head;
    HierEncoder hier;             // kind gspn_hier: its stem, stages and grids (norm, head above)
} Encoder;

// Per-block taps: PP = mixing-layer output before the residual add, PB = block output.
typedef struct EncoderTaps {
    Tensor *pp[ENCODER_MAX_DEPTH], *pb[ENCODER_MAX_DEPTH];
} EncoderTaps;

// Registers every parameter (timm names) in t; call params_alloc/params_initialize after.
void encoder_register(Encoder *e, const EncoderConfig *cfg, ParamTable *t);
// img (B,in_chans,img_h,img_w) NCHW -> tokens after the final norm (B, prefix+H*W, C) (not
// normed with fc_norm: timm's forward_features).
// taps may be NULL.
Tensor *encoder_forward(Tape *t, const Encoder *e, Tensor *img, EncoderTaps *taps);
// The tokens before the first block (patch embed, class token, pos_embed): img ->
// (B, prefix+H*W, C) fp32. encoder_forward is encoder_embed, encoder_block_forward per block,
// the final norm; a frozen teacher keeping only some taps runs the pieces itself.
Tensor *encoder_embed(Tape *t, const Encoder *e, Tensor *img);
// One block: x (B, prefix+H*W, C) fp32 -> (B, prefix+H*W, C) fp32; *pp (when pp is not NULL)
// receives the mixing-layer output. encoder_forward runs it per block; `cgspn bench block` alone.
Tensor *encoder_block_forward(Tape *t, const Encoder *e, const Block *b, Tensor *x, Tensor **pp);
// Runs the encoder at another image size (img_h x img_w, multiples of patch): the token grid
// follows. Only for encoders without a position embedding (C-GSPN, hybrid, a ViT without
// pos_embed), whose parameters do not depend on the grid: multi-resolution training and the
// resolution curriculum. 0, or -1 with a message.
int encoder_set_image_size_err(Encoder *e, int img_h, int img_w, char *err, size_t n);
void encoder_set_image_size(Encoder *e, int img_h, int img_w);
// The last block's output x -> encoder_forward's tokens: the final norm, or with fc_norm x itself
// (the norm then applies to the pooled vector, encoder_pool).
Tensor *encoder_final_norm(Tape *t, const Encoder *e, Tensor *x);
// The summary vector of encoder_forward's tokens (B, C): the class token, or the mean of the
// patch tokens (registers and class token left out), then fc_norm when the config has it, or
// with map_pool the MAP head over every token (timm's forward_head with pre_logits).
Tensor *encoder_pool(Tape *t, const Encoder *e, Tensor *tokens);
// encoder_pool, then the head: (B, num_classes).
Tensor *encoder_head(Tape *t, const Encoder *e, Tensor *tokens);
// Whether block i (0-based) is recomputed in backward (grad_checkpoint): it keeps only its input
// (and its outputs) between forward and backward. A C-GSPN block then keeps neither its latent
// nor the scan's hidden states (4 directions x Cc fp32 per token); the recomputation makes them
// again, one block at a time.
bool encoder_block_is_checkpointed(const EncoderConfig *cfg, int i);
// x itself, or with stochastic depth active (training, rate > 0) the residual branch x of block i
// (0-based; branch 0: mixing layer, 1: MLP) dropped per sample, rate * i / (depth - 1).
Tensor *encoder_drop_path(Tape *t, const Encoder *e, int block, int branch, Tensor *x);
// Width of the tokens encoder_forward returns and of encoder_pool's vector: width, or a
// hierarchical encoder's last stage's.
int encoder_out_width(const EncoderConfig *cfg);
// "vit", "cgspn", "hybrid" or "gspn_hier"
const char *encoder_kind_name(EncoderKind kind);
// Whether block i (0-based) is an attention block for this encoder.
int encoder_block_is_attention(const EncoderConfig *cfg, int i);
// Multiply-accumulates of one image's forward pass (for MFU and logs).
double encoder_flops_per_image(const EncoderConfig *cfg);
