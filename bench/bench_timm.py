#!/usr/bin/env python3
"""PyTorch's side of `cgspn bench vit`, `block`, `distill` and `classify`, measured on the same GPU.

Times timm's models, timm's ViT block and a Stage 2 distillation step, eager and torch.compile,
and writes the numbers as one flat JSON object (build/bench_timm.json) that the cgspn benches read
and print beside their own (with the ratios). `make bench` runs this first when python3 has torch
and timm. Progress lines (with the seconds since the start) go to stderr.

    python3 bench/bench_timm.py                          # everything, on the GPU
    python3 bench/bench_timm.py --only vit --no-compile  # eager ViT steps only
    python3 bench/bench_timm.py --only distill           # the distillation step and largest batches
    python3 bench/bench_timm.py --only classify          # convnext, swin, deit: tiny/small/base
    python3 bench/bench_timm.py --only dwconv            # depthwise convolutions of gspn_t/s/b
    python3 bench/bench_timm.py --smoke --device cpu     # tiny sizes: checks the script runs

vit: one training step as cgspn's bench runs it: forward under torch.autocast(bfloat16) (fp32
parameters, cast per forward: PyTorch's mixed precision), cross-entropy on random labels,
backward, clip_grad_norm_(1.0), fused AdamW (lr 1e-4, weight decay 0.05), zero_grad. Models:
vit_base_patch16_224 at 224 px, batch 256; vit_so400m_patch14_siglip_378 at 378 px, batch 32,
with a 1000-class head on the mean token (global_pool="avg", as cgspn's so14 bench) and
SigLIP's tanh GELU (act_layer="gelu_tanh", as tests/parity_timm.py and configs/vit_so14.cfg).
Each model four ways: eager, compiled, and both with timm's gradient checkpointing
(model.set_grad_checkpointing(True): every block under non-reentrant torch.utils.checkpoint),
"eager_ckpt" and "compiled_ckpt". Steps are queued back to back with a CUDA event between steps
(no host sync inside the timed run: PyTorch's best case); the median step of --steps after
--warmup. Memory: torch.cuda.max_memory_reserved (and _allocated) over the timed steps, the peak
statistics reset (after empty_cache) before them, so each configuration has its own.

block: timm's ViT Block (width 1152, 16 heads, MLP 4304, GELU tanh, qkv bias; attention through
F.scaled_dot_product_attention) on x (32, N, 1152) fp32 under bf16 autocast, N = 74^2 (1036 px)
and 147^2 (2058 px); fwd = forward under no_grad, fwd+bwd = forward + backward from a random dy
(input and weight gradients). Median of CUDA-event-timed calls after warm-up; memory: the peak
over the timed calls.

distill: the peer of `cgspn bench distill` (bench/bench_dist.c) with a ViT student: one Stage 2
step (docs/design.md#stage2, train/distill_loss.c) on random images in [-1, 1). Teacher and student
are timm ViTs of the so14 shape (vit_so400m_patch14_siglip_378 built with img_size = the image
side: width 1152, depth 27, 16 heads, MLP 4304, GELU tanh, qkv bias, no class token, avg pool, no
head; random weights). The teacher is frozen (eval, no_grad, bf16 autocast) and runs only as far
as the last tapped block, keeping only the tap tensors. Taps every 9th block (8, 17, 26, 0-based;
config taps = every 9), two per tapped block: PP = the attention sublayer's output before the
residual add (ls1(attn(norm1(x)))), PB = the block's output; the blocks are run here (as timm's
forward_features does), each under non-reentrant torch.utils.checkpoint when the student's
set_grad_checkpointing(True) is on. One adaptor per student tap, A(v) = v + fc2(gelu_tanh(fc1(v))),
hidden width 1152 (adaptor_hidden = 0: the model width), fc2 zero-initialized. Per tap
L = MSE(A(v_s), v_t) + 7/3 KL(softmax(A(v_s)) || softmax(v_t)) (softmax over the channels, KL
averaged over the tokens; in fp32); total = 0.5 mean(L_PP) + 0.5 mean(L_PB). Then backward,
clip_grad_norm_(1.0), fused AdamW (lr 1e-4, weight decay 0.05) over the student and the adaptors,
zero_grad. At 378 px, batch 32 (bench_dist.c's), 3 warm-up and 10 timed steps (its counts),
timed as the vit steps: eager and compiled (teacher and student each torch.compile'd), each with
and without the student's gradient checkpointing. Largest batch: at 378 and 1036 px, eager, with
and without checkpointing, the batch ladder (378: 8 .. 512, 1036: 1 .. 128) is climbed until the
first torch.cuda.OutOfMemoryError, two steps per candidate (memory freed after an OOM: gc +
empty_cache); the largest that fitted is then timed (1 warm-up + 3 steps). Climbing also stops
when the next candidate would take that ladder past --ladder-s seconds (default 60); that, or
reaching the ladder's top, sets max_batch_capped = 1 (a larger batch may fit).

Keys:
  "<model>/<mode>/step_ms", ".../img_per_s", ".../peak_reserved_gib", ".../peak_allocated_gib"
      mode = eager, compiled, eager_ckpt, compiled_ckpt;
      "<model>/<compiled|compiled_ckpt>/compile_s";
      "<model>/batch", "<model>/img", "<model>/timm_model";
  "block/<px>/<eager|compiled>/fwd_ms", ".../fwdbwd_ms", ".../peak_reserved_gib" and
      ".../peak_allocated_gib" (of fwd+bwd), ".../fwd_peak_reserved_gib",
      ".../fwdbwd_peak_reserved_gib";
      "block/<px>/tokens";
  "distill/378/<mode>/step_ms", ".../img_per_s", ".../peak_reserved_gib", ".../peak_allocated_gib",
      ".../batch", ".../loss" (of the last step), mode = eager, eager_ckpt, compiled, compiled_ckpt;
      "distill/378/<compiled|compiled_ckpt>/compile_s";
  "distill/<378|1036>/<eager|eager_ckpt>/max_batch", ".../max_batch_img_per_s",
      ".../max_batch_capped" (0 or 1), ".../max_batch_peak_reserved_gib",
      ".../max_batch_peak_allocated_gib";
  "distill/<px>/tokens", "distill/taps" ("8,17,26"), "distill/timm_model";
  "dwconv/<H>x<W>x<C>k<k>/fwd_ms", ".../fwdbwd_ms": nn.Conv2d(C, C, k, padding=k//2, groups=C)
      (cuDNN's depthwise convolution) on (128, C, H, W) bf16 in channels_last, bias as cgspn's
      (the LPUs have one, the mixer's convolution not); fwd under no_grad, fwd+bwd = forward and
      backward from a random dy (input, weight and bias gradients); median of --steps after
      --warmup. The shapes are `cgspn bench dwconv --list` (gspn_t/s/b at batch 128).
Memory keys are written on CUDA devices only. A failed measurement leaves its keys out and
records "<...>/error" ("block/<px>/<mode>/<fwd|fwdbwd>_error",
"distill/<px>/<mode>/max_batch_error").
--smoke: batch 2, the block at 70 px; distill with a tiny ViT (width 64, depth 6, taps every 3)
at 56 px (its keys under distill/56/, ladders 1, 2, 3 at 56 and 84 px), eager only; the vit
models without compiled_ckpt.
"""
import argparse
import datetime
import functools
import gc
import json
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F
import timm
from timm.models.vision_transformer import Block

VIT_MODELS = {
    # key: (timm name, image size, batch, extra create_model kwargs)
    "vit_b16": ("vit_base_patch16_224", 224, 256, {}),
    "vit_so14": ("vit_so400m_patch14_siglip_378", 378, 32,
                 {"global_pool": "avg", "act_layer": "gelu_tanh"}),   # SigLIP GELU, as parity_timm.py
}
# classify: the peers of `cgspn bench classify` (bench/bench_model.c CLASSIFY_CASES), 224 px.
CLASSIFY_MODELS = {
    "convnext_tiny": "convnext_tiny",
    "deit_small": "deit_small_patch16_224",
    "swin_tiny": "swin_tiny_patch4_window7_224",
    "convnext_small": "convnext_small",          # gspn_s's peer
    "swin_small": "swin_small_patch4_window7_224",
    "convnext_base": "convnext_base",            # gspn_b's peer
    "swin_base": "swin_base_patch4_window7_224",
    "deit_base": "deit_base_patch16_224",
}
CLASSIFY_BATCH = 128
BLOCK_PX = [1036, 2058]
BLOCK_B, BLOCK_C, BLOCK_HEADS, BLOCK_MLP, PATCH = 32, 1152, 16, 4304, 14

# distill: the peer of `cgspn bench distill` (bench/bench_dist.c) with a ViT student.
DIST_MODEL = "vit_so400m_patch14_siglip_378"   # teacher and student shape (configs/vit_so14.cfg)
DIST_KWARGS = {"global_pool": "avg", "act_layer": "gelu_tanh", "num_classes": 0}
DIST_SMOKE_KWARGS = {"embed_dim": 64, "depth": 6, "num_heads": 4, "mlp_ratio": 2.0}
DIST_PX, DIST_BATCH = 378, 32               # as bench_dist.c: BENCH_BATCH_PER_GPU at 378 px
DIST_WARMUP, DIST_STEPS = 3, 10             # as bench_dist.c: BENCH_WARMUP, BENCH_STEPS
DIST_TAP_EVERY = 9                          # taps = every 9: blocks 9, 18, 27 (1-based)
DIST_ALPHA = DIST_BETA = 0.5                # weights of mean L_PP, mean L_PB (config alpha, beta)
DIST_LAMBDA = 7.0 / 3.0                     # KL weight in each tap loss (config lambda1, lambda2)
DIST_ADAPTOR_HIDDEN = 0                     # config adaptor_hidden: 0 = the model width
# Largest batch: candidates per image side, tried in order until the first out-of-memory.
DIST_LADDER = {378: [8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512],
               1036: [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]}
DIST_LADDER_FIT_STEPS, DIST_LADDER_WARMUP, DIST_LADDER_STEPS = 2, 1, 3

T0 = time.perf_counter()


def progress(msg):
    """A progress line on stderr with the seconds since the start."""
    print(f"[bench_timm {time.perf_counter() - T0:7.1f} s] {msg}", file=sys.stderr, flush=True)


class Timer:
    """CUDA events on the GPU, the host clock on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(self, a, b):
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b)
        return (b - a) * 1e3

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def median_ms(self, step, steps):
        """Runs step() steps times back to back, a mark between calls (no host sync inside);
        (the median call in ms, what the last call returned)."""
        marks, last = [self.mark()], None
        for _ in range(steps):
            last = step()
            marks.append(self.mark())
        self.sync()
        return statistics.median(self.ms(a, b) for a, b in zip(marks, marks[1:])), last


def memory_stats(device):
    if device.type != "cuda":
        return {}
    return {"peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
            "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30}


def reset_memory(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def bench_vit(key, args, device, out, save):
    name, img, batch, kwargs = VIT_MODELS[key]
    if args.smoke:
        batch = 2
    out[f"{key}/batch"] = batch
    out[f"{key}/img"] = img
    out[f"{key}/timm_model"] = name
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=1000, **kwargs).to(device).train()
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, fused=fused)
    x = torch.randn(batch, 3, img, img, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    timer = Timer(device)

    def make_step(fwd):
        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = F.cross_entropy(fwd(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    modes = [("eager", False), ("eager_ckpt", True)]
    if not args.no_compile:
        modes.append(("compiled", False))
        if not args.smoke:   # one compile per model is check enough on the CPU
            modes.append(("compiled_ckpt", True))
    for mode, ckpt in modes:
        tag = f"{key}/{mode}"
        try:
            model.set_grad_checkpointing(ckpt)   # timm's: checkpoint_seq over the blocks
            reset_memory(device)
            progress(f"{tag}: batch {batch}")
            t0 = time.perf_counter()
            # A fresh torch.compile per mode; dynamo guards on model.grad_checkpointing anyway.
            fwd = torch.compile(model) if mode.startswith("compiled") else model
            step = make_step(fwd)
            step()   # the first call compiles
            timer.sync()
            if mode.startswith("compiled"):
                out[f"{tag}/compile_s"] = time.perf_counter() - t0
            for _ in range(args.warmup):
                step()
            reset_memory(device)
            ms, _ = timer.median_ms(step, args.steps)
            out[f"{tag}/step_ms"] = ms
            out[f"{tag}/img_per_s"] = batch / (ms * 1e-3)
            for k, v in memory_stats(device).items():
                out[f"{tag}/{k}"] = v
            save()
            print(f"  {key:9s} {mode:13s} batch {batch:4d}: {ms:8.2f} ms/step  "
                  f"{batch / (ms * 1e-3):8.0f} img/s  "
                  f"{out.get(tag + '/peak_reserved_gib', 0):6.2f} GiB reserved", flush=True)
        except Exception as e:   # record and go on with the next measurement
            out[f"{tag}/error"] = f"{type(e).__name__}: {e}"[:500]
            print(f"  {key} {mode}: FAILED {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
    model.set_grad_checkpointing(False)
    del model, opt, x, y
    reset_memory(device)


def make_block(device):
    blk = Block(dim=BLOCK_C, num_heads=BLOCK_HEADS, mlp_ratio=BLOCK_MLP / BLOCK_C, qkv_bias=True,
                act_layer=functools.partial(nn.GELU, approximate="tanh"))
    if blk.mlp.fc1.out_features != BLOCK_MLP:   # int(dim * ratio) may round down
        blk.mlp = timm.layers.Mlp(BLOCK_C, BLOCK_MLP,
                                  act_layer=functools.partial(nn.GELU, approximate="tanh"))
    assert blk.attn.fused_attn, "timm's Attention is not using F.scaled_dot_product_attention"
    return blk.to(device).train()


def bench_block(args, device, out, save):
    timer = Timer(device)
    torch.manual_seed(0)
    blk = make_block(device)
    cblk = None if args.no_compile else torch.compile(blk)
    pxs = [70] if args.smoke else BLOCK_PX
    batch = 2 if args.smoke else BLOCK_B
    for px in pxs:
        n = (px // PATCH) ** 2
        out[f"block/{px}/tokens"] = n
        x = torch.randn(batch, n, BLOCK_C, device=device)
        dy = torch.randn(batch, n, BLOCK_C, device=device)
        warm, reps = (1, 2) if args.smoke else ((2, 10) if px <= 1036 else (1, 5))

        for mode, fn in [("eager", blk), ("compiled", cblk)]:
            if fn is None:
                continue
            tag = f"block/{px}/{mode}"

            def fwd():
                with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
                    fn(x)

            def fwdbwd():
                xr = x.detach().requires_grad_(True)
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    yb = fn(xr)
                yb.backward(dy)

            for what, call in [("fwd", fwd), ("fwdbwd", fwdbwd)]:
                try:
                    reset_memory(device)
                    for _ in range(warm + 1):   # + 1: the first call compiles
                        call()
                    reset_memory(device)   # the peak of the timed calls, not of the compile
                    times = []
                    for _ in range(reps):
                        a = timer.mark()
                        call()
                        b = timer.mark()
                        times.append(timer.ms(a, b))
                    ms = statistics.median(times)
                    out[f"{tag}/{what}_ms"] = ms
                    mem = memory_stats(device)
                    if mem:
                        out[f"{tag}/{what}_peak_reserved_gib"] = mem["peak_reserved_gib"]
                        if what == "fwdbwd":   # the block's memory: that of forward + backward
                            out[f"{tag}/peak_reserved_gib"] = mem["peak_reserved_gib"]
                            out[f"{tag}/peak_allocated_gib"] = mem["peak_allocated_gib"]
                    save()
                    print(f"  block {px:5d} px ({n:6d} tokens) {mode:9s} {what:7s}: {ms:9.2f} ms",
                          flush=True)
                except Exception as e:
                    out[f"{tag}/{what}_error"] = f"{type(e).__name__}: {e}"[:500]
                    print(f"  block {px} {mode} {what}: FAILED {type(e).__name__}: {e}", flush=True)
                    traceback.print_exc()
        for p in blk.parameters():
            p.grad = None
        del x, dy
        reset_memory(device)


# ---- distill: a Stage 2 step, ViT teacher -> ViT student ----------------------------------------


class Adaptor(nn.Module):
    """A(v) = v + fc2(gelu_tanh(fc1(v))), fc2 zero-initialized (nn/adaptor.c): the identity at
    first."""

    def __init__(self, width, hidden):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)
        nn.init.normal_(self.fc1.weight, std=0.02)
        nn.init.zeros_(self.fc1.bias)
        nn.init.zeros_(self.fc2.weight)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, v):
        return v + self.fc2(F.gelu(self.fc1(v), approximate="tanh"))


def tapped_block(blk, x):
    """timm's Block.forward, keeping PP (the attention sublayer's output before the residual add,
    ls1 included) beside PB (the block's output)."""
    pp = blk.ls1(blk.attn(blk.norm1(x)))
    x = x + blk.drop_path1(pp)
    x = x + blk.drop_path2(blk.ls2(blk.mlp(blk.norm2(x))))
    return pp, x


def vit_taps(model, img, taps, ckpt):
    """[(PP, PB)] at the tapped blocks of a timm VisionTransformer, patch tokens only. Runs the
    blocks itself, as forward_features does, up to the last tapped block; ckpt: each block under
    torch.utils.checkpoint (non-reentrant, so the taps inside a block keep their autograd graph),
    as timm's checkpoint_seq does with set_grad_checkpointing(True)."""
    x = model.patch_embed(img)
    x = model._pos_embed(x)
    x = model.patch_drop(x)
    x = model.norm_pre(x)
    out = []
    for i in range(max(taps) + 1):
        blk = model.blocks[i]
        if i in taps:
            if ckpt:
                pp, x = torch.utils.checkpoint.checkpoint(tapped_block, blk, x, use_reentrant=False)
            else:
                pp, x = tapped_block(blk, x)
            out.append((pp, x))
        elif ckpt:
            x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
        else:
            x = blk(x)
    p = model.num_prefix_tokens   # 0 for the so14 shape (no class token); dropped otherwise
    return [(pp[:, p:], pb[:, p:]) for pp, pb in out]


def tap_loss(a, vs, vt, lam):
    """train/distill_loss.c's tap loss: MSE(A(v_s), v_t) (mean over all elements)
    + lam * KL(P(A(v_s)) || P(v_t)), P = softmax over the channels of a token, KL summed over
    the channels and averaged over the tokens (kernels/cpu/losses.c token_kl). fp32."""
    s = a(vs).float()
    t = vt.float()
    mse = F.mse_loss(s, t)
    ls, lt = F.log_softmax(s, dim=-1), F.log_softmax(t, dim=-1)
    kl = (ls.exp() * (ls - lt)).sum(-1).mean()
    return mse + lam * kl


def is_oom(e):
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return True
    msg = str(e)
    return isinstance(e, RuntimeError) and ("out of memory" in msg or "ALLOC_FAILED" in msg)


class Distill:
    """Teacher, student, adaptors and the optimizer at one image side; step(x) is one Stage 2
    step: the frozen teacher's forward (no_grad, bf16 autocast, the tap tensors kept), the
    student's forward with its taps, the adaptors and the loss (bf16 autocast), backward,
    clip_grad_norm_(1.0), fused AdamW (lr 1e-4, weight decay 0.05), zero_grad."""

    def __init__(self, px, args, device):
        kwargs = dict(DIST_KWARGS, **(DIST_SMOKE_KWARGS if args.smoke else {}))
        torch.manual_seed(0)
        with torch.device(device):   # initialized in place on the GPU: seconds, not a minute
            self.teacher = timm.create_model(DIST_MODEL, pretrained=False, img_size=px, **kwargs)
            self.student = timm.create_model(DIST_MODEL, pretrained=False, img_size=px, **kwargs)
        self.teacher.eval().requires_grad_(False)
        self.student.train()
        depth, width = len(self.student.blocks), self.student.embed_dim
        every = 3 if args.smoke else DIST_TAP_EVERY
        self.taps = list(range(every - 1, depth, every))   # every=9: 8, 17, 26 (0-based)
        hidden = DIST_ADAPTOR_HIDDEN or width
        self.ad_pp = nn.ModuleList(Adaptor(width, hidden) for _ in self.taps).to(device)
        self.ad_pb = nn.ModuleList(Adaptor(width, hidden) for _ in self.taps).to(device)
        self.params = [p for m in (self.student, self.ad_pp, self.ad_pb) for p in m.parameters()]
        self.opt = torch.optim.AdamW(self.params, lr=1e-4, weight_decay=0.05,
                                     fused=device.type == "cuda")
        self.device, self.px = device, px
        self.tokens = self.student.patch_embed.num_patches
        self.teacher_fwd, self.student_fwd = self.teacher_taps, self.student_loss

    def teacher_taps(self, img):
        return vit_taps(self.teacher, img, self.taps, False)

    def student_loss(self, img, tt):
        st = vit_taps(self.student, img, self.taps, self.student.grad_checkpointing)
        n = len(self.taps)
        lpp = sum(tap_loss(a, s[0], t[0], DIST_LAMBDA) for a, s, t in zip(self.ad_pp, st, tt))
        lpb = sum(tap_loss(a, s[1], t[1], DIST_LAMBDA) for a, s, t in zip(self.ad_pb, st, tt))
        return DIST_ALPHA * lpp / n + DIST_BETA * lpb / n

    def compile(self):
        self.teacher_fwd = torch.compile(self.teacher_taps)
        self.student_fwd = torch.compile(self.student_loss)

    def eager(self):
        self.teacher_fwd, self.student_fwd = self.teacher_taps, self.student_loss

    def images(self, batch):
        g = torch.Generator(device=self.device).manual_seed(7919)
        return torch.rand(batch, 3, self.px, self.px, device=self.device, generator=g) * 2 - 1

    def step(self, x):
        dt = self.device.type
        with torch.no_grad(), torch.autocast(dt, dtype=torch.bfloat16):
            tt = self.teacher_fwd(x)
        with torch.autocast(dt, dtype=torch.bfloat16):
            loss = self.student_fwd(x, tt)
        del tt
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def free(self):
        self.opt.zero_grad(set_to_none=True)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def distill_timed(d, batch, warmup, steps, timer):
    """warmup + steps steps at batch; (median step ms, loss of the last step)."""
    x = d.images(batch)
    for _ in range(warmup):
        d.step(x)
    reset_memory(d.device)
    ms, loss = timer.median_ms(lambda: d.step(x), steps)
    return ms, float(loss)


def distill_steps(d, args, device, out, save):
    """distill/<px>/<eager|compiled>[_ckpt]/...: the step at DIST_BATCH, four ways."""
    timer = Timer(device)
    batch = 2 if args.smoke else DIST_BATCH
    warmup, steps = (1, 2) if args.smoke else (DIST_WARMUP, DIST_STEPS)
    modes = [("eager", False), ("eager_ckpt", True)]
    if not args.no_compile and not args.smoke:
        modes += [("compiled", False), ("compiled_ckpt", True)]
    for mode, ckpt in modes:
        tag = f"distill/{d.px}/{mode}"
        try:
            d.student.set_grad_checkpointing(ckpt)
            if mode.startswith("compiled"):
                if mode == "compiled":
                    d.compile()
                progress(f"{tag}: compiling (teacher and student), batch {batch}")
                t0 = time.perf_counter()
                d.step(d.images(batch))   # the first call compiles
                timer.sync()
                out[f"{tag}/compile_s"] = time.perf_counter() - t0
            else:
                d.eager()
            reset_memory(device)
            progress(f"{tag}: {warmup} + {steps} steps at batch {batch}")
            ms, loss = distill_timed(d, batch, warmup, steps, timer)
            out[f"{tag}/batch"] = batch
            out[f"{tag}/step_ms"] = ms
            out[f"{tag}/img_per_s"] = batch / (ms * 1e-3)
            out[f"{tag}/loss"] = loss
            for k, v in memory_stats(device).items():
                out[f"{tag}/{k}"] = v
            save()
            print(f"  distill {d.px:4d} px {mode:13s} batch {batch:4d}: {ms:8.2f} ms/step  "
                  f"{batch / (ms * 1e-3):8.1f} img/s  "
                  f"{out.get(tag + '/peak_reserved_gib', 0):6.2f} GiB reserved  loss {loss:.4f}",
                  flush=True)
        except Exception as e:
            out[f"{tag}/error"] = f"{type(e).__name__}: {e}"[:500]
            print(f"  distill {d.px} {mode}: FAILED {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
        d.free()
    d.eager()
    d.student.set_grad_checkpointing(False)


def distill_max_batch(d, ckpt, args, device, out, save):
    """distill/<px>/eager[_ckpt]/max_batch and max_batch_img_per_s: the ladder's largest batch
    whose DIST_LADDER_FIT_STEPS steps run without running out of memory (climbing stops at the
    first that does not), then DIST_LADDER_WARMUP + DIST_LADDER_STEPS steps timed at it. Climbing
    also stops when the next candidate would take the ladder past --ladder-s seconds, or at the
    ladder's top: then max_batch_capped = 1 (more would fit)."""
    timer = Timer(device)
    tag = f"distill/{d.px}/eager{'_ckpt' if ckpt else ''}"
    ladder = [1, 2, 3] if args.smoke else DIST_LADDER[d.px]
    d.eager()
    d.student.set_grad_checkpointing(ckpt)
    # capped: more may fit (climbing stopped by the time limit or at the ladder's top)
    fits, capped, s_per_img, t_start = [], True, None, time.perf_counter()
    for b in ladder:
        spent = time.perf_counter() - t_start
        if s_per_img is not None and spent + s_per_img * b * DIST_LADDER_FIT_STEPS > args.ladder_s:
            progress(f"{tag}: batch {b} would take the ladder past {args.ladder_s:.0f} s: stop")
            break
        progress(f"{tag}: batch {b}?")
        oom = False
        try:
            reset_memory(device)
            x = d.images(b)
            t0 = time.perf_counter()
            for _ in range(DIST_LADDER_FIT_STEPS):
                d.step(x)
            timer.sync()
            s_per_img = (time.perf_counter() - t0) / (DIST_LADDER_FIT_STEPS * b)
            fits.append(b)
            mem = memory_stats(device)
            progress(f"{tag}: batch {b} fits" +
                     (f" ({mem['peak_reserved_gib']:.1f} GiB reserved)" if mem else ""))
        except Exception as e:
            if not is_oom(e):
                out[f"{tag}/max_batch_error"] = f"{type(e).__name__}: {e}"[:500]
                print(f"  {tag} max batch: FAILED {type(e).__name__}: {e}",
                      flush=True)
                traceback.print_exc()
                d.free()
                return
            oom = True
        x = None
        d.free()   # after the except block: the exception's frames no longer hold tensors
        if oom:
            capped = False
            progress(f"{tag}: batch {b} is out of memory")
            break
    # The img/s at the largest batch that fitted; should a fragmented allocator now refuse it,
    # the next smaller.
    while fits:
        best = fits[-1]
        try:
            progress(f"{tag}: timing batch {best}")
            reset_memory(device)
            ms, loss = distill_timed(d, best, DIST_LADDER_WARMUP, DIST_LADDER_STEPS, timer)
            out[f"{tag}/max_batch"] = best
            out[f"{tag}/max_batch_img_per_s"] = best / (ms * 1e-3)
            out[f"{tag}/max_batch_capped"] = int(capped)
            for k, v in memory_stats(device).items():
                out[f"{tag}/max_batch_{k}"] = v
            save()
            print(f"  distill {d.px:4d} px {tag.split('/')[-1]:13s} max batch {best:4d}"
                  f"{'+' if capped else ' '}: {best / (ms * 1e-3):8.1f} img/s  "
                  f"{out.get(tag + '/max_batch_peak_reserved_gib', 0):6.2f} GiB reserved",
                  flush=True)
            break
        except Exception as e:
            if not is_oom(e):
                out[f"{tag}/max_batch_error"] = f"{type(e).__name__}: {e}"[:500]
                traceback.print_exc()
                break
        d.free()
        fits.pop()
    else:
        out[f"{tag}/max_batch_error"] = f"no batch of {ladder} fits"
    d.free()
    d.student.set_grad_checkpointing(False)


def bench_distill(args, device, out, save):
    step_px, ladder_px = ([56], [56, 84]) if args.smoke else ([DIST_PX], list(DIST_LADDER))
    for px in sorted(set(step_px) | set(ladder_px)):
        progress(f"distill {px} px: building teacher and student ({DIST_MODEL} shape)")
        try:
            d = Distill(px, args, device)
        except Exception as e:
            out[f"distill/{px}/error"] = f"{type(e).__name__}: {e}"[:500]
            print(f"  distill {px}: FAILED {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
            continue
        out["distill/timm_model"] = DIST_MODEL
        out["distill/taps"] = ",".join(str(i) for i in d.taps)
        out[f"distill/{px}/tokens"] = d.tokens
        if px in step_px:
            distill_steps(d, args, device, out, save)
        if px in ladder_px:
            for ckpt in (False, True):
                distill_max_batch(d, ckpt, args, device, out, save)
        del d
        gc.collect()
        reset_memory(device)
        save()


def bench_classify(args, device, out, save):
    """ImageNet classifiers at 224 px, batch CLASSIFY_BATCH: a training step as bench_vit's, and
    inference (forward under no_grad and bf16 autocast, eval mode), eager and compiled."""
    batch = 2 if args.smoke else CLASSIFY_BATCH
    timer = Timer(device)
    x = torch.randn(batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    wanted = args.classify_models.split(",") if args.classify_models else list(CLASSIFY_MODELS)
    for key in wanted:
        if key not in CLASSIFY_MODELS:
            sys.exit(f"bench_timm.py: --classify-models: unknown {key!r} (one of {', '.join(CLASSIFY_MODELS)})")
    for key, name in ((k, CLASSIFY_MODELS[k]) for k in wanted):
        out[f"classify/{key}/batch"] = batch
        out[f"classify/{key}/timm_model"] = name
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False, num_classes=1000).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05,
                                fused=device.type == "cuda")
        modes = ["eager"] + ([] if args.no_compile else ["compiled"])
        for mode in modes:
            tag = f"classify/{key}/{mode}"
            try:
                fwd = torch.compile(model) if mode == "compiled" else model

                def train_step():
                    with torch.autocast(device.type, dtype=torch.bfloat16):
                        loss = F.cross_entropy(fwd(x), y)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    opt.step()
                    opt.zero_grad(set_to_none=True)

                def infer_step():
                    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
                        fwd(x)

                for what, step, train in (("step", train_step, True), ("infer", infer_step, False)):
                    model.train(train)
                    progress(f"{tag} {what}: batch {batch}")
                    for _ in range(1 + args.warmup):   # the first call compiles
                        step()
                    ms, _ = timer.median_ms(step, args.steps)
                    out[f"{tag}/{what}_ms"] = ms
                    out[f"{tag}/{what}_img_per_s"] = batch / (ms * 1e-3)
                    save()
                    print(f"  {key:14s} {mode:9s} {what:5s} batch {batch:4d}: {ms:8.2f} ms  "
                          f"{batch / (ms * 1e-3):8.0f} img/s", flush=True)
            except Exception as e:   # record and go on with the next measurement
                out[f"{tag}/error"] = f"{type(e).__name__}: {e}"[:500]
                print(f"  {key} {mode}: FAILED {type(e).__name__}: {e}", flush=True)
                traceback.print_exc()
        del model, opt
        reset_memory(device)


def bench_dwconv(args, device, out, save):
    """cuDNN's depthwise convolution on the shapes `cgspn bench dwconv --list` prints."""
    import subprocess
    cgspn = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cgspn")
    lines = subprocess.run([cgspn, "bench", "dwconv", "--list"], check=True, capture_output=True,
                           text=True).stdout.split("\n")
    timer = Timer(device)
    for line in [l for l in lines if l.strip()]:
        B, H, W, C, k, bias = (int(v) for v in line.split())
        if args.smoke:
            B = 2
        key = f"dwconv/{H}x{W}x{C}k{k}"
        try:
            conv = nn.Conv2d(C, C, k, padding=k // 2, groups=C, bias=bool(bias)).to(
                device, dtype=torch.bfloat16, memory_format=torch.channels_last)
            x = torch.randn(B, C, H, W, device=device, dtype=torch.bfloat16).to(
                memory_format=torch.channels_last).requires_grad_(True)
            dy = torch.randn_like(x)

            def fwd():
                with torch.no_grad():
                    conv(x)

            def fwdbwd():
                conv(x).backward(dy)

            for what, f in (("fwd", fwd), ("fwdbwd", fwdbwd)):
                for _ in range(args.warmup):
                    f()
                out[f"{key}/{what}_ms"], _ = timer.median_ms(f, args.steps)
            save()
            print(f"  dwconv {H}x{W}x{C} k{k}: fwd {out[key + '/fwd_ms']:.3f} ms, "
                  f"fwd+bwd {out[key + '/fwdbwd_ms']:.3f} ms", flush=True)
        except Exception as e:   # record and go on with the next shape
            out[f"{key}/error"] = f"{type(e).__name__}: {e}"[:500]
            print(f"  {key}: FAILED {type(e).__name__}: {e}", flush=True)
        reset_memory(device)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="build/bench_timm.json")
    ap.add_argument("--only", choices=["all", "vit", "block", "distill", "classify", "dwconv"], default="all")
    ap.add_argument("--models", default=",".join(VIT_MODELS), help="vit model keys")
    ap.add_argument("--classify-models", default="",
                    help="classify peers to run, comma-separated (default: all of CLASSIFY_MODELS)")
    ap.add_argument("--no-compile", action="store_true", help="eager only")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--ladder-s", type=float, default=60.0,
                    help="distill: seconds each largest-batch ladder may climb for")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny batches and one small block")
    ap.add_argument("--append", action="store_true",
                    help="keep the keys already in --out (one run per section, each under a timeout)")
    args = ap.parse_args()
    if args.smoke:
        args.steps, args.warmup = 2, 1
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_timm.py: no CUDA device visible (use --device cpu --smoke to check the script)")
    torch.backends.cudnn.benchmark = True
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    out = {}
    if args.append and os.path.exists(args.out):
        with open(args.out) as f:
            out = json.load(f)
    out.update({"device": name,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
           "torch": torch.__version__, "timm": timm.__version__,
           "steps": args.steps, "warmup": args.warmup})
    print(f"bench_timm.py: {name}, {out['date']}, torch {torch.__version__}, timm {timm.__version__}",
          flush=True)

    def save():
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".tmp", "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
        os.replace(args.out + ".tmp", args.out)

    if args.only in ("all", "vit"):
        for key in [k for k in args.models.split(",") if k]:
            if key not in VIT_MODELS:
                sys.exit(f"bench_timm.py: unknown model {key}; known: {', '.join(VIT_MODELS)}")
            bench_vit(key, args, device, out, save)
    if args.only in ("all", "block"):
        bench_block(args, device, out, save)
    if args.only in ("all", "distill"):
        bench_distill(args, device, out, save)
    if args.only in ("all", "classify"):
        bench_classify(args, device, out, save)
    if args.only in ("all", "dwconv"):
        bench_dwconv(args, device, out, save)
    save()
    print(f"bench_timm.py: wrote {args.out}", flush=True)
    return 1 if any(k.endswith("error") for k in out) else 0


if __name__ == "__main__":
    sys.exit(main())
