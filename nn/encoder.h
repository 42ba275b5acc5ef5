// Encoders of docs/design.md#encoders: ViT (timm semantics), C-GSPN (no pos_embed, no class token), the
// hybrid (attention every k-th block), and the hierarchical GSPN classifier (nn/hier.h). Tokens
// are channels-last: (B, prefix + H*W, C).
#pragma once
#include "encoder_config.h"
#include "layers.h"
#include "hier.h"

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
// x itself, or with stochastic depth active the residual branch x of block i dropped per sample
// (encoder_drop_branch with e's settings).
Tensor *encoder_drop_path(Tape *t, const Encoder *e, int block, int branch, Tensor *x);
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
// Multiply-accumulates of one image's forward pass (for MFU and logs).
double encoder_flops_per_image(const EncoderConfig *cfg);
