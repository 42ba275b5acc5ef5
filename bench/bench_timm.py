#!/usr/bin/env python3
"""PyTorch's side of `cgspn bench vit` and `cgspn bench block`, measured on the same GPU.

Times timm's models and timm's ViT block, eager and torch.compile, and writes the numbers as one
flat JSON object (build/bench_timm.json) that the cgspn benches read and print beside their own
(with the ratios). `make bench` runs this first when python3 has torch and timm. Progress lines
(with the seconds since the start) go to stderr.

    python3 bench/bench_timm.py                          # everything, on the GPU
    python3 bench/bench_timm.py --only vit --no-compile  # eager ViT steps only
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

Keys:
  "<model>/<mode>/step_ms", ".../img_per_s", ".../peak_reserved_gib", ".../peak_allocated_gib"
      mode = eager, compiled, eager_ckpt, compiled_ckpt;
      "<model>/<compiled|compiled_ckpt>/compile_s";
      "<model>/batch", "<model>/img", "<model>/timm_model";
  "block/<px>/<eager|compiled>/fwd_ms", ".../fwdbwd_ms", ".../peak_reserved_gib" and
      ".../peak_allocated_gib" (of fwd+bwd), ".../fwd_peak_reserved_gib",
      ".../fwdbwd_peak_reserved_gib";
      "block/<px>/tokens";
Memory keys are written on CUDA devices only. A failed measurement leaves its keys out and
records "<...>/error" ("block/<px>/<mode>/<fwd|fwdbwd>_error").
--smoke: batch 2, the block at 70 px; the vit models without compiled_ckpt.
"""
import argparse
import datetime
import functools
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
BLOCK_PX = [1036, 2058]
BLOCK_B, BLOCK_C, BLOCK_HEADS, BLOCK_MLP, PATCH = 32, 1152, 16, 4304, 14

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
            marks = [timer.mark()]
            for _ in range(args.steps):
                step()
                marks.append(timer.mark())
            timer.sync()
            times = [timer.ms(a, b) for a, b in zip(marks, marks[1:])]
            ms = statistics.median(times)
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="build/bench_timm.json")
    ap.add_argument("--only", choices=["all", "vit", "block"], default="all")
    ap.add_argument("--models", default=",".join(VIT_MODELS), help="vit model keys")
    ap.add_argument("--no-compile", action="store_true", help="eager only")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
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
    save()
    print(f"bench_timm.py: wrote {args.out}", flush=True)
    return 1 if any(k.endswith("error") for k in out) else 0


if __name__ == "__main__":
    sys.exit(main())
