#!/usr/bin/env python3
"""The house's layering, checked over every quoted #include (docs/layout.md draws it):

    kernels/   the base (tensor, dtype, error, RNG, arena, device context), the op table
               (ops.h), the device interface (device.h) and the backends cpu/ and cuda/
    nn/        layers, tape, parameters            -> kernels/ (not its backends)
    data/      shards, loader, augmentation        -> kernels/ (the base only)
    dist/      process group, gradient buckets     -> kernels/, nn/ (the parameter table)
    train/     commands and training loops         -> nn/, data/, dist/, kernels/
    bench/     benchmark drivers; bench/cpu/ and   -> everything below; bench/cpu|cuda/ may
               bench/cuda/ time the backends          reach their backend's internals

A file may include files of its own folder and of the folders its layer stands on, nothing
above. Nothing above kernels/ tests CGSPN_CUDA: the backend choice happens once, in
kernels/dispatch.c and kernels/device.c. Exits 1 naming every violation.

Usage: tools/check_layers.py [ROOT]   (ROOT defaults to the repository this script is in)
"""
import os
import re
import sys

# (folder of the including file, folders it must not include, why). The first rule whose
# folder is a prefix of the file's path applies; paths are relative to the root.
RULES = [
    ("kernels/", ["nn/", "data/", "dist/", "train/", "bench/"],
     "kernels/ is the bottom layer"),
    ("data/", ["nn/", "dist/", "train/", "bench/", "kernels/cpu/", "kernels/cuda/"],
     "data/ stands on the base in kernels/ only"),
    ("nn/", ["data/", "dist/", "train/", "bench/", "kernels/cpu/", "kernels/cuda/"],
     "nn/ reaches the backends only through kernels/ops.h and kernels/device.h"),
    ("dist/", ["data/", "train/", "bench/", "kernels/cpu/"],
     "dist/ stands beside train/, below it"),
    ("train/main.c", ["kernels/cpu/", "kernels/cuda/"],
     "the command table may name bench/'s command, nothing below the op table"),
    ("train/", ["bench/", "kernels/cpu/", "kernels/cuda/"],
     "train/ reaches the backends only through kernels/ops.h and kernels/device.h"),
    ("bench/cpu/", ["kernels/cuda/"], "a CPU micro-benchmark"),
    ("bench/cuda/", ["kernels/cpu/"], "a CUDA micro-benchmark"),
    ("bench/", ["kernels/cpu/", "kernels/cuda/"],
     "bench/'s drivers reach the backends through the op table and the device interface; "
     "the micro-benchmarks in bench/cpu/ and bench/cuda/ time them directly"),
]

# Known exceptions, each with its reason: (including file, included file).
ALLOWED = {
    # The NCCL path of the gradient buckets runs collectives on a CUDA stream of its own
    # beside the context's main stream; it is communication code, not a kernel.
    ("dist/grads.c", "kernels/cuda/cuda_common.h"),
}

# Folders where `CGSPN_CUDA` must not appear (the backend choice is made below them).
NO_BACKEND_MACRO = ["nn/", "data/", "dist/", "train/", "bench/"]
BACKEND_MACRO_ALLOWED = {"dist/grads.c"}   # with the include above

SOURCE_EXT = (".c", ".h", ".cu", ".cuh")
LAYER_DIRS = ["kernels", "nn", "data", "dist", "train", "bench"]
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def rule_for(path):
    for folder, banned, why in RULES:
        if path == folder or (folder.endswith("/") and path.startswith(folder)):
            return banned, why
    return None, None


def check(root):
    problems = []
    for top in LAYER_DIRS:
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if not name.endswith(SOURCE_EXT):
                    continue
                full = os.path.join(dirpath, name)
                path = os.path.relpath(full, root).replace(os.sep, "/")
                text = open(full, encoding="utf-8", errors="replace").read()
                banned, why = rule_for(path)
                for m in INCLUDE.finditer(text):
                    target = os.path.normpath(os.path.join(os.path.dirname(path), m.group(1)))
                    target = target.replace(os.sep, "/")
                    if (path, target) in ALLOWED or not banned:
                        continue
                    for b in banned:
                        if target.startswith(b):
                            line = text.count("\n", 0, m.start()) + 1
                            problems.append(f"{path}:{line}: includes {target} ({why})")
                if any(path.startswith(d) for d in NO_BACKEND_MACRO) and \
                        path not in BACKEND_MACRO_ALLOWED:
                    for m in re.finditer(r"^\s*#\s*(?:if|ifdef|ifndef|elif)\b.*CGSPN_CUDA", text, re.M):
                        line = text.count("\n", 0, m.start()) + 1
                        problems.append(f"{path}:{line}: tests CGSPN_CUDA (the backend choice "
                                        "belongs to kernels/dispatch.c and kernels/device.c)")
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems = check(root)
    for p in problems:
        print(f"check_layers: {p}")
    if problems:
        print(f"check_layers: {len(problems)} upward dependencies (the layers: tools/check_layers.py, "
              "docs/layout.md)")
        return 1
    print("check_layers: every include points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
