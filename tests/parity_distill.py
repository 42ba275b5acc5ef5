#!/usr/bin/env python3
"""cgspn distill against PyTorch: one Stage 1 / Stage 2 loss and its gradients (docs/design.md#cgspn-layer, docs/design.md#losses).

The teacher is a timm ViT (class token, head on the mean of the patch tokens), random weights,
made for a 2x2 grid and run at 4x4 (its pos_embed resampled by timm's resample_abs_pos_embed on
this side, by `cgspn distill` on the other). The student is a C-GSPN of the same width and
depth written here from docs/design.md#cgspn-layer (the four-direction scan as a plain loop), with adaptors,
random weights (adaptors' W2 included, so they matter). For each case `cgspn distill CONFIG
--images X --loss-out L --init W` computes the loss of one batch; this script computes the same
from docs/design.md#losses in PyTorch and compares the loss, every logged part and the gradient of every
trainable parameter. A fourth case adds a second teacher of another shape: a timm ViT
with 2 registers and pos_embed on the patch tokens only, width 24, depth 2, patch 4, seen at 32 px
in its own input normalization; its taps, bilinearly resized to the student's grid, pair with its
blocks proportionally, through width-changing adaptors, and the student's pooled vector learns
its class token (summary).

Run from the repository root after `make` (the GPU machine for bf16; fp32 anywhere):
    python3 tests/parity_distill.py --precision fp32 --device cpu
    python3 tests/parity_distill.py                      # fp32 and bf16 on the GPU

Error: max |cgspn - torch| / max |torch| per tensor, against the fp32 PyTorch reference. Bounds:
fp32 1e-4; bf16 3e-2, or 1.5 times PyTorch's own bf16 error on that tensor when that is larger
(the same reference under torch.autocast(bfloat16): on this small random model some losses are
MSEs of nearly equal features, where bf16 rounding of the features alone moves the result by
several percent, in PyTorch as in cgspn). In bf16 both errors are RMS values over 16 realizations
whose roundings are drawn anew (realization()): one draw of them is noise.
"""
import argparse
import contextlib
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
import timm
from timm.layers import resample_abs_pos_embed
from safetensors.torch import save_file, load_file

BOUND = {"fp32": 1e-4, "bf16": 3e-2}
# bf16: a tensor may also be off by this multiple of PyTorch autocast's own error on it, both the
# RMS over BF16_REALIZATIONS draws of the roundings (realization()): one draw is noise on the
# gradients that are sums of nearly cancelling terms (docs/gspn_hier.md measures it on gspn_t),
# and an RMS over n draws is itself uncertain by about 1/sqrt(2n): 18% at 16 draws, 32% at 5, too
# close to the factor (on an H100, 5 draws put two gradients 1.0-1.16x over; 16 draws none).
BF16_TORCH_FACTOR = 1.5
BF16_REALIZATIONS = 16
C, DEPTH, HEADS, HIDDEN, CC, PATCH, IMG, CLASSES = 32, 4, 4, 64, 8, 7, 28, 10
GRID = IMG // PATCH

# (name, overrides of the run config)
CASES = [
    ("stage1", {"stage": "1"}),
    ("stage2_all_adaptors", {"stage": "2", "taps": "all", "adaptor_hidden": "24"}),
    ("stage2_taps_2_4_pb_ce", {"stage": "2", "taps": "2,4", "tap_pp": "0", "adaptors": "0",
                               "gamma": "0.7", "alpha": "0.3", "beta": "0.8", "lambda2": "1.5"}),
    # extra_teachers is filled in with the work folder's t2.cfg (T2 below)
    ("stage2_two_teachers", {"stage": "2", "taps": "all", "adaptor_hidden": "24",
                             "data_mean": "0.3", "data_std": "0.8", "extra_teachers": ""}),
]
# Teacher 2 of stage2_two_teachers and its teacher-file keys.
C2, DEPTH2, IMG2, PATCH2, REGS2, HIDDEN_AD2 = 24, 2, 32, 4, 2, 16
T2 = {"teacher_img_size": IMG2, "teacher_mean": 0.1, "teacher_std": 0.5, "alpha": 0.4, "beta": 0.9,
      "lambda1": 1.0, "summary_weight": 0.6, "adaptor_hidden": HIDDEN_AD2}


def rel_err(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


# ---- the student, docs/design.md#cgspn-layer ---------------------------------------------------------------

def scan_tb(xc, lam, u, wt):
    """Top-to-bottom scan over dim 1 of (B, H, W, Cc); neighbours j-1, j, j+1 along dim 2.
    wt (B, H, W, 3, Cc) raw weights for offsets -1, 0, +1."""
    B, H, W, Cc = xc.shape
    j = torch.arange(W)
    exists = torch.stack([(j - 1 >= 0), torch.ones(W, dtype=torch.bool), (j + 1 < W)])  # (3, W)
    exists = exists.to(xc.dtype).T[None, :, :, None]                                  # (1,W,3,1)
    rows, h = [], torch.zeros(B, W, Cc, dtype=xc.dtype)
    for i in range(H):
        a = torch.sigmoid(wt[:, i]) * exists                                          # (B,W,3,Cc)
        w = a / a.sum(dim=2, keepdim=True).clamp_min(1e-7)
        left = F.pad(h, (0, 0, 1, 0))[:, :W]        # h[j-1], 0 at j = 0
        right = F.pad(h, (0, 0, 0, 1))[:, 1:]       # h[j+1], 0 at j = W-1
        h = lam[:, i] * xc[:, i] + w[:, :, 0] * left + w[:, :, 1] * h + w[:, :, 2] * right
        rows.append(h)
    return u * torch.stack(rows, dim=1)


def gspn_propagate(xc, g, merge):
    B, H, W, Cc = xc.shape
    out = 0
    for d in range(4):   # TB, BT, LR, RL, in the original frame
        blk = g[..., d * 5 * Cc:(d + 1) * 5 * Cc]
        lam, u = blk[..., :Cc], blk[..., Cc:2 * Cc]
        wt = blk[..., 2 * Cc:].reshape(B, H, W, 3, Cc)
        x, lam_, u_, wt_ = xc, lam, u, wt
        if d >= 2:   # columns: the same scan on the transposed grid
            x, lam_, u_, wt_ = (t.transpose(1, 2) for t in (xc, lam, u, wt))
        if d % 2 == 1:   # bottom-to-top / right-to-left: the flipped scan, flipped back
            x, lam_, u_, wt_ = (t.flip(1) for t in (x, lam_, u_, wt_))
        y = scan_tb(x, lam_, u_, wt_)
        if d % 2 == 1:
            y = y.flip(1)
        if d >= 2:
            y = y.transpose(1, 2)
        out = out + merge[d] * y
    return out


class GspnLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.down, self.gate = nn.Linear(C, CC), nn.Linear(CC, 20 * CC)
        self.merge = nn.Parameter(torch.full((4,), 0.25))
        self.norm, self.up = nn.LayerNorm(CC, eps=1e-6), nn.Linear(CC, C)

    def forward(self, x):   # (B, H, W, C)
        xc = self.down(x)
        return self.up(self.norm(gspn_propagate(xc, self.gate(xc), self.merge)))


class Mlp(nn.Module):
    def __init__(self, hidden=HIDDEN, width=C, out=C):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, hidden), nn.Linear(hidden, out)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.gspn = nn.LayerNorm(C, eps=1e-6), GspnLayer()
        self.norm2, self.mlp = nn.LayerNorm(C, eps=1e-6), Mlp()

    def forward(self, x):   # (B, N, C) -> (B, N, C), pp
        B = x.shape[0]
        pp = self.gspn(self.norm1(x).reshape(B, GRID, GRID, C)).reshape(B, GRID * GRID, C)
        x = x + pp
        return x + self.mlp(self.norm2(x)), pp


class PatchEmbed(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(1, C, PATCH, PATCH)


class Student(nn.Module):
    def __init__(self, adaptor_hidden, second_teacher=False):
        super().__init__()
        self.patch_embed = PatchEmbed()
        self.blocks = nn.ModuleList([Block() for _ in range(DEPTH)])
        self.norm, self.head = nn.LayerNorm(C, eps=1e-6), nn.Linear(C, CLASSES)
        ad = {str(i): nn.ModuleDict({"pp": Mlp(adaptor_hidden), "pb": Mlp(adaptor_hidden)})
              for i in range(DEPTH)}
        if second_teacher:   # C -> C2, no residual: adaptors.t2.N.pp/pb, adaptors.t2.summary
            t2 = {str(i): nn.ModuleDict({"pp": Mlp(HIDDEN_AD2, C, C2), "pb": Mlp(HIDDEN_AD2, C, C2)})
                  for i in range(DEPTH)}
            t2["summary"] = Mlp(HIDDEN_AD2, C, C2)
            ad["t2"] = nn.ModuleDict(t2)
        self.adaptors = nn.ModuleDict(ad)

    def forward(self, img):
        x = self.patch_embed.proj(img).flatten(2).transpose(1, 2)   # (B, N, C)
        pps, pbs = [], []
        for b in self.blocks:
            x, pp = b(x)
            pps.append(pp)
            pbs.append(x)
        self.pooled = self.norm(x).mean(1)   # the summary loss's student side
        return self.head(self.pooled), pps, pbs


# ---- docs/design.md#losses -------------------------------------------------------------------------------

def token_kl(s, t):
    ls, lt = F.log_softmax(s, -1), F.log_softmax(t, -1)
    return (ls.exp() * (ls - lt)).sum(-1).mean()


def teacher_taps(teacher, img, prefix=1):
    ins, pps, pbs = {}, {}, {}
    hooks = []
    for i, blk in enumerate(teacher.blocks):
        hooks.append(blk.register_forward_pre_hook(lambda m, a, i=i: ins.__setitem__(i, a[0])))
        hooks.append(blk.attn.register_forward_hook(lambda m, a, o, i=i: pps.__setitem__(i, o)))
        hooks.append(blk.register_forward_hook(lambda m, a, o, i=i: pbs.__setitem__(i, o)))
    with torch.no_grad():
        teacher.forward_features(img)
    for h in hooks:
        h.remove()
    patches = lambda d: {i: v[:, prefix:].detach() for i, v in d.items()}   # drop class (+ registers)
    return patches(ins), patches(pps), patches(pbs)


def second_teacher_loss(teacher2, student, img, spp, spb, parts):
    """Teacher 2's part: its view (the image resized to IMG2, antialiased, renormalized from the
    student's 0.3 / 0.8 to its own), its taps resized to the student's grid, blocks paired
    proportionally (round(b * DEPTH2 / DEPTH), halves up), width-changing adaptors, its summary."""
    view = F.interpolate(img, size=(IMG2, IMG2), mode="bilinear", antialias=True, align_corners=False)
    view = (view * 0.8 + 0.3 - T2["teacher_mean"]) / T2["teacher_std"]
    _, tpp, tpb = teacher_taps(teacher2, view, prefix=1 + REGS2)
    g = IMG2 // PATCH2

    def on_student_grid(v):   # (B, g*g, C2) -> (B, GRID*GRID, C2), bilinear, half-pixel centres
        v = v.reshape(v.shape[0], g, g, C2).permute(0, 3, 1, 2)
        v = F.interpolate(v, size=(GRID, GRID), mode="bilinear", align_corners=False)
        return v.permute(0, 2, 3, 1).reshape(v.shape[0], GRID * GRID, C2)

    ad = student.adaptors["t2"]
    lpp, lpb, comp = [], [], {"mse_pp": [], "kl_pp": [], "mse_pb": [], "kl_pb": []}
    for i in range(DEPTH):
        tb = int(math.floor((i + 1) * DEPTH2 / DEPTH + 0.5)) - 1
        for kind, vs, vt, lam, acc in (("pp", spp[i], tpp[tb], T2["lambda1"], lpp),
                                       ("pb", spb[i], tpb[tb], 7 / 3, lpb)):
            s = ad[str(i)][kind](vs)
            vt = on_student_grid(vt)
            mse, kl = F.mse_loss(s, vt), token_kl(s, vt)
            comp["mse_" + kind].append(mse)
            comp["kl_" + kind].append(kl)
            acc.append(mse + lam * kl)
            parts[f"t2.{kind}_b{i + 1}"] = acc[-1]
    for k, v in comp.items():
        parts["t2." + k] = torch.stack(v).mean()
    with torch.no_grad():
        summary_t = teacher2.forward_features(view)[:, 0]   # the class token after the final norm
    summary = F.mse_loss(ad["summary"](student.pooled), summary_t)
    parts["t2.summary"] = summary
    return (T2["alpha"] * torch.stack(lpp).mean() + T2["beta"] * torch.stack(lpb).mean()
            + T2["summary_weight"] * summary)


def reference(case, teacher, student, img, targets, teacher2=None):
    o = {k: v for k, v in case.items()}
    stage = int(o["stage"])
    tin, tpp, tpb = teacher_taps(teacher, img)
    student.zero_grad()
    parts = {}
    if stage == 1:
        losses = []
        for i, b in enumerate(student.blocks):
            x = b.norm1(tin[i]).reshape(img.shape[0], GRID, GRID, C)
            l = F.mse_loss(b.gspn(x).reshape(tpp[i].shape), tpp[i])
            parts[f"mse_b{i + 1}"] = l
            losses.append(l)
        loss = torch.stack(losses).mean()
        trainable = lambda n: ".gspn." in n
    else:
        taps = list(range(DEPTH)) if o.get("taps", "all") == "all" else [int(t) - 1 for t in o["taps"].split(",")]
        use_pp, use_ad = o.get("tap_pp", "1") == "1", o.get("adaptors", "1") == "1"
        alpha, beta = float(o.get("alpha", 0.5)), float(o.get("beta", 0.5))
        lam1, lam2 = float(o.get("lambda1", 7 / 3)), float(o.get("lambda2", 7 / 3))
        gamma = float(o.get("gamma", 0))
        logits, spp, spb = student(img)
        lpp, lpb, comp = [], [], {"mse_pp": [], "kl_pp": [], "mse_pb": [], "kl_pb": []}
        for i in taps:
            for kind, vs, vt, lam, acc in (("pp", spp[i], tpp[i], lam1, lpp), ("pb", spb[i], tpb[i], lam2, lpb)):
                if kind == "pp" and not use_pp:
                    continue
                s = vs + student.adaptors[str(i)][kind](vs) if use_ad else vs
                mse, kl = F.mse_loss(s, vt), token_kl(s, vt)
                comp["mse_" + kind].append(mse)
                comp["kl_" + kind].append(kl)
                acc.append(mse + lam * kl)
                parts[f"{kind}_b{i + 1}"] = acc[-1]
        loss = beta * torch.stack(lpb).mean()
        if use_pp:
            loss = loss + alpha * torch.stack(lpp).mean()
        for k, v in comp.items():
            if v:
                parts[k] = torch.stack(v).mean()
        if gamma > 0:
            ce = -(targets * F.log_softmax(logits, -1)).sum(-1).mean()
            parts["ce"] = ce
            loss = loss + gamma * ce
        if teacher2 is not None:
            loss = loss + second_teacher_loss(teacher2, student, img, spp, spb, parts)
        last = max(taps)
        used_adaptors = {f"adaptors.{i}.{k}." for i in taps for k in (("pp", "pb") if use_pp else ("pb",))}

        def trainable(n):
            if n.startswith("adaptors.t2."):
                return teacher2 is not None
            if n.startswith("adaptors."):
                return use_ad and any(n.startswith(p) for p in used_adaptors)
            if gamma > 0:
                return True
            if n.startswith("head."):
                return False
            if teacher2 is not None:   # the summary reaches every block and the final norm
                return True
            if n.startswith("norm."):
                return False
            return not (n.startswith("blocks.") and int(n.split(".")[1]) > last)
    loss.backward()
    grads = {n: p.grad for n, p in student.named_parameters() if trainable(n)}
    return loss.detach(), {k: v.detach() for k, v in parts.items()}, grads


# ---- running both ------------------------------------------------------------------------------

def reference_bf16(case, teacher, student, img, targets, teacher2=None):
    """The same computation as PyTorch runs it in bf16 mixed precision (autocast: bf16 matmuls and
    linears, fp32 reductions), for the bf16 bound."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, parts, grads = reference(case, teacher, student, img, targets, teacher2)
    return loss.float(), {k: v.float() for k, v in parts.items()}, {k: g.float() for k, g in grads.items()}


@contextlib.contextmanager
def realization(student, img, k):
    """Realization k > 0: the student's weights (in place, restored afterwards) and the images
    scaled by 1 + 2^-9 u (u uniform in [-1, 1], seed k), about one bf16 ulp, so every bf16
    rounding lands anew while the reference moves by ~0.2%."""
    if k == 0:
        yield img
        return
    gen = torch.Generator().manual_seed(k)
    saved = [p.detach().clone() for p in student.parameters()]
    with torch.no_grad():
        for p in student.parameters():
            p.mul_(1 + 2.0 ** -9 * (torch.rand(p.shape, generator=gen) * 2 - 1))
    try:
        yield img * (1 + 2.0 ** -9 * (torch.rand(img.shape, generator=gen) * 2 - 1))
    finally:
        with torch.no_grad():
            for p, v in zip(student.parameters(), saved):
                p.copy_(v)


def measure(args, work, name, case, precision, teacher, student, img, targets, teacher2):
    """One `cgspn distill --loss-out` run against the PyTorch reference: the per-tensor errors,
    PyTorch autocast's own (bf16), and whether the trainable sets agree."""
    sw = {n: p.detach().contiguous() for n, p in student.named_parameters()}
    if case.get("adaptors", "1") == "0" or case["stage"] == "1":
        sw = {n: v for n, v in sw.items() if not n.startswith("adaptors.")}
    save_file(sw, f"{work}/{name}_student.safetensors")
    save_file({"images": img, "targets": targets}, f"{work}/images.safetensors")
    ref_loss, ref_parts, ref_grads = reference(case, teacher, student, img, targets, teacher2)
    torch_bf16 = {}
    if precision == "bf16":
        bl, bp, bg = reference_bf16(case, teacher, student, img, targets, teacher2)
        torch_bf16["loss"] = rel_err(bl, ref_loss)
        torch_bf16.update({f"part {k}": rel_err(bp[k], v) for k, v in ref_parts.items()})
        torch_bf16.update({f"grad {n}": rel_err(bg[n], g) for n, g in ref_grads.items()})
    out = f"{work}/{name}_{precision}.safetensors"
    cmd = [args.cgspn, "distill", f"{work}/{name}.cfg", "--images", f"{work}/images.safetensors",
           "--loss-out", out, "--init", f"{work}/{name}_student.safetensors",
           f"--precision={precision}", f"--device={args.device}"]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    ours = load_file(out)
    errs = {"loss": rel_err(ours["loss"], ref_loss.reshape(1))}
    for k, v in ref_parts.items():
        errs[f"part {k}"] = rel_err(ours[f"part.{k}"], v.reshape(1))
    mine = {k[5:] for k in ours if k.startswith("grad.")}
    same = mine == set(ref_grads)
    if not same:
        print(f"  trainable sets differ: cgspn only {sorted(mine - set(ref_grads))}, "
              f"torch only {sorted(set(ref_grads) - mine)}")
    for n, g in ref_grads.items():
        if f"grad.{n}" in ours:
            errs[f"grad {n}"] = rel_err(ours[f"grad.{n}"].reshape(g.shape), g)
    return errs, torch_bf16, same


def write_cfg(path, keys):
    with open(path, "w") as f:
        for k, v in keys.items():
            f.write(f"{k} = {v}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precision", default="fp32,bf16")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--cgspn", default="./cgspn")
    ap.add_argument("--realizations", type=int, default=BF16_REALIZATIONS,
                    help="bf16: draws of the roundings the RMS errors are taken over")
    args = ap.parse_args()
    torch.manual_seed(0)
    ok = True
    with tempfile.TemporaryDirectory() as work:
        # The teacher, made for a 2x2 grid (14 px), run at 28 px.
        small = timm.create_model("vit_base_patch16_224", pretrained=False, img_size=IMG // 2,
                                  patch_size=PATCH, in_chans=1, num_classes=CLASSES, embed_dim=C,
                                  depth=DEPTH, num_heads=HEADS, mlp_ratio=HIDDEN / C,
                                  global_pool="avg", fc_norm=False).float().eval()
        with torch.no_grad():
            for n, p in small.named_parameters():
                base = 1.0 if n.endswith("norm1.weight") or n.endswith("norm2.weight") or n == "norm.weight" else 0.0
                p.copy_(torch.randn_like(p) * (0.3 if p.ndim > 1 else 0.1) + base)
        tweights = {n: p.detach().contiguous() for n, p in small.named_parameters()}
        save_file({"visual.trunk." + n: v for n, v in tweights.items()}, f"{work}/teacher.safetensors")
        teacher = timm.create_model("vit_base_patch16_224", pretrained=False, img_size=IMG,
                                    patch_size=PATCH, in_chans=1, num_classes=CLASSES, embed_dim=C,
                                    depth=DEPTH, num_heads=HEADS, mlp_ratio=HIDDEN / C,
                                    global_pool="avg", fc_norm=False).float().eval()
        sd = dict(tweights)
        sd["pos_embed"] = resample_abs_pos_embed(sd["pos_embed"], new_size=(GRID, GRID),
                                                 old_size=(GRID // 2, GRID // 2), num_prefix_tokens=1)
        teacher.load_state_dict(sd)
        write_cfg(f"{work}/teacher.cfg", {
            "model": "vit", "img_size": IMG // 2, "in_chans": 1, "patch": PATCH, "width": C,
            "depth": DEPTH, "heads": HEADS, "mlp_hidden": HIDDEN, "class_token": 1, "pos_embed": 1,
            "global_pool": "avg", "num_classes": CLASSES})

        # Teacher 2: registers, pos_embed on the patch tokens only, another width, depth and patch;
        # drawn from its own seed, so the other cases see the same random numbers as before.
        rng = torch.random.fork_rng()
        rng.__enter__()
        torch.manual_seed(2)
        teacher2 = timm.create_model("vit_base_patch16_224", pretrained=False, img_size=IMG2,
                                     patch_size=PATCH2, in_chans=1, num_classes=0, embed_dim=C2,
                                     depth=DEPTH2, num_heads=4, mlp_ratio=2.0, reg_tokens=REGS2,
                                     no_embed_class=True, global_pool="token").float().eval()
        with torch.no_grad():
            for n, p in teacher2.named_parameters():
                base = 1.0 if n.endswith("norm1.weight") or n.endswith("norm2.weight") or n == "norm.weight" else 0.0
                p.copy_(torch.randn_like(p) * (0.3 if p.ndim > 1 else 0.1) + base)
        save_file({n: p.detach().contiguous() for n, p in teacher2.named_parameters()},
                  f"{work}/teacher2.safetensors")
        write_cfg(f"{work}/teacher2.cfg", {
            "model": "vit", "img_size": IMG2, "in_chans": 1, "patch": PATCH2, "width": C2,
            "depth": DEPTH2, "heads": 4, "mlp_hidden": 2 * C2, "class_token": 1, "reg_tokens": REGS2,
            "no_embed_class": 1, "pos_embed": 1, "global_pool": "token", "num_classes": 0})
        write_cfg(f"{work}/t2.cfg", dict({"teacher": f"{work}/teacher2.safetensors",
                                          "teacher_config": f"{work}/teacher2.cfg"}, **T2))
        rng.__exit__(None, None, None)

        img = torch.randn(3, 1, IMG, IMG)
        targets = F.softmax(torch.randn(3, CLASSES), -1)
        save_file({"images": img, "targets": targets}, f"{work}/images.safetensors")

        for name, case in CASES:
            hidden = int(case.get("adaptor_hidden", 0)) or C
            two = "extra_teachers" in case
            if two:
                case = dict(case, extra_teachers=f"{work}/t2.cfg")
            student = Student(hidden, second_teacher=two).float()
            with torch.no_grad():
                for n, p in student.named_parameters():
                    if n.endswith("merge"):
                        p.copy_(torch.rand_like(p) * 0.5 + 0.1)
                    elif "norm" in n and n.endswith("weight"):
                        p.copy_(1 + 0.1 * torch.randn_like(p))
                    else:
                        p.copy_(torch.randn_like(p) * (0.3 if p.ndim > 1 else 0.1))
            cfg = {"model": "cgspn", "img_size": IMG, "in_chans": 1, "patch": PATCH, "width": C,
                   "depth": DEPTH, "heads": HEADS, "mlp_hidden": HIDDEN, "class_token": 0,
                   "pos_embed": 0, "global_pool": "avg", "num_classes": CLASSES, "gspn_latent": CC,
                   "teacher": f"{work}/teacher.safetensors", "teacher_config": f"{work}/teacher.cfg",
                   "teacher_prefix": "visual.trunk."}
            cfg.update(case)
            write_cfg(f"{work}/{name}.cfg", cfg)
            t2 = teacher2 if two else None
            for precision in args.precision.split(","):
                draws = args.realizations if precision == "bf16" else 1
                ours_sq, torch_sq = {}, {}
                for k in range(draws):
                    with realization(student, img, k) as im:
                        errs, torch_bf16, same = measure(args, work, name, case, precision,
                                                         teacher, student, im, targets, t2)
                    ok &= same
                    for key, e in errs.items():
                        ours_sq[key] = ours_sq.get(key, 0.0) + e * e / draws
                    for key, e in torch_bf16.items():
                        torch_sq[key] = torch_sq.get(key, 0.0) + e * e / draws
                errs = {key: math.sqrt(v) for key, v in ours_sq.items()}
                torch_bf16 = {key: math.sqrt(v) for key, v in torch_sq.items()}
                bound = BOUND[precision]

                def bound_of(key):
                    if precision != "bf16":
                        return bound
                    return max(bound, BF16_TORCH_FACTOR * torch_bf16.get(key, 0))
                worst = max(errs, key=lambda key: errs[key] / bound_of(key))
                over = {key: e for key, e in errs.items() if e > bound_of(key)}
                rms = f" (RMS over {draws} realizations)" if draws > 1 else ""
                print(f"{name} {precision}{rms}: {len(errs)} tensors; worst {errs[worst]:.2e} "
                      f"({worst}, bound {bound_of(worst):.1e})")
                if precision == "bf16":
                    tw = max(torch_bf16, key=torch_bf16.get)
                    print(f"  PyTorch autocast bf16 against fp32: worst {torch_bf16[tw]:.2e} ({tw})")
                for key, e in over.items():
                    print(f"  OVER BOUND {key}: {e:.2e} (bound {bound_of(key):.1e})")
                ok &= not over
    print("parity: PASSED" if ok else "parity: FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
