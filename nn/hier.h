// The hierarchical GSPN encoder (model = gspn_hier): the fast GSPN-T/S/B classifiers of the
// C-GSPN paper (Table 2), laid out as the public GSPN-1 classification code lays out its VSSM.
//
//   stem      conv 3x3 s2 (in -> C/2) + LN + GELU, conv 3x3 s2 (C/2 -> C) + LN     stride 4
//   stage s   depths[s] blocks at width C_s = C * 2^s, then (s < 3) a downsampling
//             conv 3x3 s2 (C_s -> 2 C_s) + LN
//   block     x = x + lpu1(x)                          Local Perception Unit: dwconv 3x3, bias
//             x = x + mixer(norm1(x))
//             x = x + lpu2(x)
//             x = x + mlp(norm2(x))                    fc1 (C_s -> mlp_ratio C_s), GELU, fc2
//   mixer     v = silu(dwconv_k(in_proj(h)))           in_proj (C_s -> Ci = mixer_ratio C_s), no
//                                                      bias; dwconv k = mixer_conv, no bias
//             out = cgspn_layer(v)                     Ci -> Cc = gspn_latent (the compressive
//                                                      proxy, 2 in the paper) -> scan with weights
//                                                      shared across channels -> C_s (no LN over
//                                                      2 channels: it would give +-1)
//   head      LN, mean over the 7x7 grid, linear
//
// Everything is channels-last: (B,H,W,C) between layers, the residual stream fp32. The stem's
// convolutions read the NCHW image. Where the papers leave a detail open the choice is GSPN-1's,
// named in configs/gspn_t.cfg; docs/gspn_hier.md lists the departures.
#pragma once
#include "encoder_config.h"   // EncoderConfig, HIER_STAGES, stochastic depth
#include "layers.h"

#define HIER_MAX_BLOCKS 64
#define HIER_LPU_KERNEL 3

// A block's ops in the order they run, as the diagnostic CGSPN_FP32_OPS names them (hier.c).
typedef enum {
    HIER_OP_NORM1, HIER_OP_IN_PROJ, HIER_OP_CONV, HIER_OP_SILU, HIER_OP_DOWN, HIER_OP_GATE,
    HIER_OP_SCAN, HIER_OP_UP, HIER_OP_NORM2, HIER_OP_MLP, HIER_OPS
} HierOp;

typedef struct HierBlock {
    Conv2d lpu1, lpu2;        // depthwise 3x3 with bias
    LayerNorm norm1, norm2;
    Linear in_proj;           // (Ci, C_s), no bias
    Conv2d mixer_conv;        // depthwise mixer_conv x mixer_conv, no bias
    CgspnLayer gspn;          // Ci -> Cc -> C_s
    Mlp mlp;
    int stage;
} HierBlock;

typedef struct HierEncoder {
    Conv2d stem1, stem2;
    LayerNorm stem_norm1, stem_norm2;
    HierBlock blocks[HIER_MAX_BLOCKS];
    Conv2d down[HIER_STAGES - 1];
    LayerNorm down_norm[HIER_STAGES - 1];
    int grid_h[HIER_STAGES], grid_w[HIER_STAGES];   // each stage's token grid
    unsigned fp32_ops;        // bit HIER_OP_*: ops a bf16 run keeps in fp32 (CGSPN_FP32_OPS)
} HierEncoder;

// Registers the stem's, the stages' and the downsamplings' parameters (names below:
// stem.*, stages.S.blocks.J.*, stages.S.downsample.*; the encoder adds norm and head) and sets
// h's grids. Reads CGSPN_FP32_OPS, a diagnostic: a comma list of block ops (norm1, in_proj,
// conv, silu, down, gate, scan, up, norm2, mlp; "all"; "-op" takes one out again) that a bf16 run
// computes in fp32, inputs and weights converted up, to find which op's bf16 rounding carries an
// error (docs/gspn_hier.md).
void hier_register(HierEncoder *h, const EncoderConfig *c, ParamTable *t);
// img (B,in_chans,H,W) NCHW -> the last stage's tokens (B, h*w, C_3), before the encoder's final
// norm. dp: stochastic depth. taps (may be NULL): per block, pp the mixer's output and pb the
// block's output, each (B, H_s*W_s, C_s).
Tensor *hier_forward(Tape *t, const HierEncoder *h, const EncoderConfig *c,
                     const EncoderDropPath *dp, Tensor *img, Tensor **pp, Tensor **pb);
// The token grid of each stage for an image side: the 3x3 stride-2 convolutions give ceil(n/2).
void hier_grids(const EncoderConfig *c, int *grid_h, int *grid_w);
// One depthwise convolution of a block: grid (H, W), C channels, k x k. The LPUs run on the fp32
// residual stream with a bias; the mixer's runs in the activation dtype without one.
typedef struct HierDwconv {
    int stage, H, W, C, k;
    bool lpu;
} HierDwconv;
// The model's depthwise convolutions in the order the forward runs them (lpu1, mixer conv, lpu2
// per block): writes at most max into out and returns how many there are.
int hier_dwconvs(const EncoderConfig *c, HierDwconv *out, int max);
// Multiply-accumulates of one image's forward pass: convolutions, linears, depthwise
// convolutions and the scan (5 per channel and direction: 3 neighbours, lam x, u h). Norms,
// activations and pooling are left out, as fvcore counts the papers' GMACs.
double hier_macs_per_image(const EncoderConfig *c);
