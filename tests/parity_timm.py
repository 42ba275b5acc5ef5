#!/usr/bin/env python3
"""cgspn against timm: per-block PP/PB features, final-norm tokens, the pooled summary, logits, and
one backward pass, for ViT-B/16, the so400m shape and the teacher families: DeiT-III
(no_embed_class, layer scale; also on 224 x 320 images), DINOv2 with registers (518 px, patch 14),
timm's CLIP image tower (norm_pre), fc_norm pooling and SigLIP's MAP head.

Builds a random-init timm model (pretrained=False; every tensor, biases and norms included,
redrawn so nothing is trivially 0 or 1), exports it to safetensors with timm's names, runs
`cgspn features` on the same images with --grads, and compares. The loss backpropagated on both
sides is sum(norm * probe_norm) + sum(logits * probe_logits) (+ sum(pooled * probe_pooled) with
fc_norm) with fixed random probes, so every parameter gets a gradient.

Run on the GPU machine from the repository root after `make`:
    python3 tests/parity_timm.py                      # every model of MODELS
    python3 tests/parity_timm.py --models deit3_s16,dinov2_s14_reg4,clip_b16,vit_s16_fc_norm
    python3 tests/parity_timm.py --models vit_b16 --precision fp32 --device cpu   # quick CPU check

Error per tensor: max |cgspn - timm| / max |timm| (relative to the tensor's scale).
Bounds: fp32 <= 1e-4, bf16 <= 2e-2. Exit status 1 when any tensor is over its bound.
SigLIP's MAP head (attn_pool) runs forward only in cgspn (teachers, features): siglip_b16_map
compares its pooled output, and its backward starts at the final norm; the so400m shape drops it.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch
import timm
from safetensors.torch import save_file, load_file

MODELS = {
    # name: (timm model, cgspn config, batch, img, timm kwargs, cgspn --key=value overrides)
    "vit_b16": ("vit_base_patch16_224", "configs/vit_b16.cfg", 2, 224, {}, []),
    # the MAP head dropped: compared up to the final norm; SigLIP's GELU (docs/design.md#encoders)
    "vit_so14": ("vit_so400m_patch14_siglip_378", "configs/vit_so14.cfg", 1, 378,
                 {"global_pool": "", "num_classes": 0, "act_layer": "gelu_tanh"}, []),
    # the distillation teacher families, each with a 10-class head so logits are compared too
    "deit3_s16": ("deit3_small_patch16_224", "configs/deit3_s16.cfg", 2, 224,
                  {"num_classes": 10}, ["--num_classes=10"]),
    "dinov2_s14_reg4": ("vit_small_patch14_reg4_dinov2", "configs/dinov2_s14_reg4.cfg", 1, 518,
                        {"num_classes": 10}, ["--num_classes=10"]),
    "clip_b16": ("vit_base_patch16_clip_224", "configs/clip_b16.cfg", 2, 224,
                 {"num_classes": 10}, ["--num_classes=10"]),
    "vit_s16_fc_norm": ("vit_small_patch16_224", "configs/vit_s16_fc_norm.cfg", 2, 224,
                        {"global_pool": "avg", "fc_norm": True, "num_classes": 10},
                        ["--num_classes=10"]),
    # a non-square input: 224 x 320 images, 14 x 20 tokens (timm img_size=(224, 320))
    "deit3_s16_224x320": ("deit3_small_patch16_224", "configs/deit3_s16.cfg", 2, (224, 320),
                          {"num_classes": 10, "img_size": (224, 320)}, ["--num_classes=10"]),
    # SigLIP's MAP head (attn_pool), forward only: its pooled output is compared, the backward
    # runs from the final norm alone
    "siglip_b16_map": ("vit_base_patch16_siglip_224", "configs/siglip_b16_map.cfg", 2, 224,
                       {"num_classes": 0, "act_layer": "gelu_tanh"}, []),
}
# Models whose MAP head cgspn runs (forward only); vit_so14 drops its head.
MAP_HEAD = {"siglip_b16_map"}
NORM_WEIGHTS = ("norm1.weight", "norm2.weight", "norm.weight", "norm_pre.weight", "fc_norm.weight")
BOUND = {"fp32": 1e-4, "bf16": 2e-2}


def rel_err(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def timm_reference(model, images, probe_norm, probe_logits, probe_pooled, map_head=False):
    """Features, norm output, pooled summary, logits and parameter gradients of the timm model
    (fp32, CPU)."""
    feats = {}
    hooks = []
    for i, blk in enumerate(model.blocks):
        hooks.append(blk.attn.register_forward_hook(
            lambda m, inp, out, i=i: feats.__setitem__(f"blocks.{i}.pp", out)))
        hooks.append(blk.register_forward_hook(
            lambda m, inp, out, i=i: feats.__setitem__(f"blocks.{i}.pb", out)))
    model.zero_grad()
    x = model.forward_features(images)            # after the final norm (identity with fc_norm)
    feats["norm"] = x
    loss = (x * probe_norm).sum()
    if map_head:                                  # compared, not backpropagated
        with torch.no_grad():
            feats["pooled"] = model.forward_head(x.detach(), pre_logits=True)
    if probe_pooled is not None:                  # class token or fc_norm(mean of patches)
        pooled = model.forward_head(x, pre_logits=True)
        feats["pooled"] = pooled
        loss = loss + (pooled * probe_pooled).sum()
    if probe_logits is not None:
        logits = model.forward_head(x)
        feats["logits"] = logits
        loss = loss + (logits * probe_logits).sum()
    loss.backward()
    for h in hooks:
        h.remove()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in feats.items()}, grads


def run_model(key, precisions, device, workdir, cgspn):
    timm_name, cfg, batch, img, timm_kwargs, overrides = MODELS[key]
    torch.manual_seed(0)
    model = timm.create_model(timm_name, pretrained=False, **timm_kwargs).float().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if key == "vit_so14" and (n.startswith("attn_pool") or n.startswith("head")):
                continue
            std = 0.02 if p.ndim > 1 else 0.1
            p.copy_(torch.randn_like(p) * std + (1.0 if n.endswith(NORM_WEIGHTS) else 0.0))
    map_head = key in MAP_HEAD
    params = {n: p.detach().contiguous() for n, p in model.named_parameters()
              if map_head or not n.startswith("attn_pool")}
    wpath = os.path.join(workdir, f"{key}.safetensors")
    save_file(params, wpath)

    height, width = img if isinstance(img, tuple) else (img, img)
    images = torch.randn(batch, 3, height, width)
    tokens = model.patch_embed.num_patches + model.num_prefix_tokens   # class + registers
    probe_norm = torch.randn(batch, tokens, model.embed_dim)
    probe_logits = torch.randn(batch, model.num_classes) if model.num_classes > 0 else None
    # the summary is compared where it is more than the class token or a plain mean: fc_norm
    probe_pooled = torch.randn(batch, model.embed_dim) if not isinstance(
        getattr(model, "fc_norm", torch.nn.Identity()), torch.nn.Identity) else None
    ipath = os.path.join(workdir, f"{key}_images.safetensors")
    inputs = {"images": images, "probe_norm": probe_norm}
    if probe_logits is not None:
        inputs["probe_logits"] = probe_logits
    if probe_pooled is not None:
        inputs["probe_pooled"] = probe_pooled
    save_file(inputs, ipath)

    ref_feats, ref_grads = timm_reference(model, images, probe_norm, probe_logits, probe_pooled,
                                          map_head)

    ok = True
    for precision in precisions:
        ok &= compare(key, cfg, overrides, precision, device, workdir, cgspn, wpath, ipath,
                      ref_feats, ref_grads)
    return ok


def compare(key, cfg, overrides, precision, device, workdir, cgspn, wpath, ipath, ref_feats,
            ref_grads):
    fpath = os.path.join(workdir, f"{key}_{precision}_feats.safetensors")
    gpath = os.path.join(workdir, f"{key}_{precision}_grads.safetensors")
    cmd = [cgspn, "features", cfg, "--weights", wpath, "--images", ipath, "--out", fpath,
           "--grads", gpath, f"--precision={precision}", f"--device={device}"] + overrides
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    ours = load_file(fpath)
    our_grads = load_file(gpath)

    bound = BOUND[precision]
    worst, failures = 0.0, []
    for name, ref in list(ref_feats.items()) + [(f"grad {n}", g) for n, g in ref_grads.items()]:
        if name.startswith("grad "):
            mine = our_grads[name[5:]].reshape(ref.shape)
        else:
            mine = ours[name]
        err = rel_err(mine, ref)
        worst = max(worst, err)
        if err > bound:
            failures.append((name, err))
    print(f"{key} {precision} on {device}: {len(ref_feats)} feature tensors, {len(ref_grads)} "
          f"gradients; worst max-relative error {worst:.2e} (bound {bound:.0e})")
    for name, err in failures:
        print(f"  OVER BOUND {name}: {err:.2e}")
    return not failures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--precision", default="fp32,bf16")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--cgspn", default="./cgspn")
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    ok = True
    with tempfile.TemporaryDirectory() as work:
        for key in args.models.split(","):
            ok &= run_model(key, args.precision.split(","), args.device, work, args.cgspn)
    print("parity: PASSED" if ok else "parity: FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
