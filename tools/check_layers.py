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
    app/       main.c: the command table           -> train/'s and bench/'s commands

A file may include files of its own folder and of the folders its layer stands on, nothing
above. Nothing above kernels/ tests CGSPN_CUDA: the backend choice happens once, in
kernels/dispatch.c and kernels/device.c. Inside one folder no units call each other in a loop:
a unit is a source (foo.c or foo.cu) with its interface foo.h, and it uses another when it calls
a function that one defines and declares in its header. Exits 1 naming every violation.

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
    ("app/", ["kernels/cpu/", "kernels/cuda/"],
     "the command table names train/'s and bench/'s commands, nothing below the op table"),
    ("train/", ["bench/", "app/", "kernels/cpu/", "kernels/cuda/"],
     "train/ stands below bench/ and app/, and reaches the backends only through kernels/ops.h "
     "and kernels/device.h"),
    ("bench/cpu/", ["kernels/cuda/"], "a CPU micro-benchmark"),
    ("bench/cuda/", ["kernels/cpu/"], "a CUDA micro-benchmark"),
    ("bench/", ["app/", "kernels/cpu/", "kernels/cuda/"],
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
LAYER_DIRS = ["kernels", "nn", "data", "dist", "train", "bench", "app"]
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
    return problems + unit_cycles(root)


def strip_c(text):
    """C text without comments, string and character literals, or preprocessor lines."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text)
    text = re.sub(r"'(\\.|[^'\\])*'", "''", text)
    return re.sub(r"^\s*#[^\n]*(\\\n[^\n]*)*", " ", text, flags=re.M)


NOT_CALLS = {"if", "for", "while", "switch", "return", "sizeof", "do", "else", "case",
             "defined", "__attribute__", "__typeof__", "_Generic", "alignof"}
IDENT = re.compile(r"[A-Za-z_]\w*")


def defs_and_calls(text):
    """(functions defined at file scope: name -> static?, names called inside bodies)."""
    defs, calls, depth, start, i = {}, set(), 0, 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "{":
            if depth == 0:
                head = text[start:i]
                m = re.search(r"([A-Za-z_]\w*)\s*\([^()]*(\([^()]*\)[^()]*)*\)\s*"
                              r"(__attribute__\s*\(\(.*?\)\))?\s*$", head, re.S)
                if m and m.group(1) not in NOT_CALLS:
                    defs[m.group(1)] = "static" in head[:m.start(1)].split(";")[-1]
            depth += 1
        elif ch == "}":
            depth -= 1
            start = i + 1 if depth == 0 else start
        elif ch == ";" and depth == 0:
            start = i + 1
        elif depth > 0:
            m = IDENT.match(text, i)
            if m:
                k = m.end()
                while k < len(text) and text[k] in " \t\n":
                    k += 1
                if k < len(text) and text[k] == "(" and m.group(0) not in NOT_CALLS:
                    calls.add(m.group(0))
                i = m.end()
                continue
        i += 1
    return defs, calls


def unit_cycles(root):
    """Loops between the units of one folder (foo.c or foo.cu with its interface foo.h): unit A
    uses unit B when A's source calls a function that B's source defines and B's header
    declares. One problem per loop, naming its units in order."""
    problems = []
    for top in LAYER_DIRS:
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            sources = [n for n in sorted(names) if n.endswith((".c", ".cu"))]
            scanned, interface = {}, {}
            for name in sources:
                unit = os.path.splitext(name)[0]
                text = open(os.path.join(dirpath, name), encoding="utf-8", errors="replace").read()
                scanned[unit] = defs_and_calls(strip_c(text))
                header = os.path.join(dirpath, unit + ".h")
                interface[unit] = set(re.findall(r"([A-Za-z_]\w*)\s*\(", strip_c(
                    open(header, encoding="utf-8", errors="replace").read()))) \
                    if os.path.exists(header) else set()
            owner = {}
            for unit, (defs, _) in scanned.items():
                for fn, static in defs.items():
                    if not static and fn in interface[unit]:
                        owner[fn] = unit
            edges = {}
            for unit, (_, calls) in scanned.items():
                for fn in calls:
                    if fn in owner and owner[fn] != unit:
                        edges.setdefault(unit, set()).add(owner[fn])
            folder = os.path.relpath(dirpath, root).replace(os.sep, "/")
            for loop in find_loops(edges):
                problems.append(f"{folder}/: units call each other in a loop "
                                f"{' -> '.join(loop + [loop[0]])} (move what both need into a "
                                "unit of its own)")
    return problems


def find_loops(edges):
    """One loop per strongly connected group of two or more units (Tarjan), in name order."""
    index, low, stack, on, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    loops = []
    for group in groups:   # walk from the first unit along edges inside the group back to it
        path, seen, v = [group[0]], {group[0]}, group[0]
        while True:
            nxt = sorted(w for w in edges.get(v, ()) if w in group)
            back = [w for w in nxt if w == group[0]]
            if back and len(path) > 1:
                break
            w = next((w for w in nxt if w not in seen), None)
            if w is None:
                break
            path.append(w)
            seen.add(w)
            v = w
        loops.append(path)
    return loops


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems = check(root)
    for p in problems:
        print(f"check_layers: {p}")
    if problems:
        print(f"check_layers: {len(problems)} upward dependencies or loops (the layers: "
              "tools/check_layers.py, docs/layout.md)")
        return 1
    print("check_layers: every include points down, no units call each other in a loop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
