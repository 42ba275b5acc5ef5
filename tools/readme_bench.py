#!/usr/bin/env python3
"""Copies benchmark output into the docs verbatim.

Usage: tools/readme_bench.py [FILE [NAME]] [--doc PATH]

FILE (default build/bench.txt, the `make bench` output) goes between the markers
<!-- bench:begin --> and <!-- bench:end -->, or, with NAME, between <!-- bench:NAME:begin -->
and <!-- bench:NAME:end --> (a bench run outside `make bench`, e.g. under mpirun, saved under
results/: NAME is `distill` for results/bench_distill_h200x2.txt, `curriculum` for
results/bench_curriculum_h200.txt, `memory` for results/bench_memory_h100.txt, `classify` for
results/bench_classify_h100.txt). The markers live in docs/benchmarks.md, where every
measured table is; --doc PATH names another file that holds them.

When FILE has the `bench vit` and `bench block` sections (the `make bench` output, or a run of
those benchmarks under a NAME) the headline lines are also copied into README.md,
between <!-- bench:headline:begin --> and <!-- bench:headline:end -->: from `cgspn bench vit`
its header line, the step table (grad_checkpoint 0 and 1) and the PyTorch table with the
ratios of img/s and of GPU memory; from `cgspn bench block` its header line, the block table and
the speed-ups (with the memory ratio); from `cgspn bench distill --memory=1` (when present) the
table of grad_checkpoint 0 and 1 beside PyTorch's step; from `cgspn bench distill --max-batch`
(when present) the largest-batch table and the PyTorch peer line. Each excerpt is the file's own
lines, in order. When FILE lacks the vit or block section (a partial run), README.md is left as
it is, with a note. When FILE has a `bench classify` section, its header line, tables and ratio
line go into README.md between <!-- bench:classify-headline:begin --> and
<!-- bench:classify-headline:end -->.

Numbers are never typed by hand: this script is the only way they reach the docs. Run it from
the repository root; running it again on the same FILE changes nothing. Output saved by older
builds names its targets by the work items they came from, and fused kernels by op names the op
table no longer has; LABELS and OP_LABELS rewrite those to what the benches print now (the
numbers are untouched)."""
import re
import sys

DEFAULT_DOC = "docs/benchmarks.md"
README = "README.md"


# Older bench output's wording -> today's (the same line, the same numbers).
LABELS = [
    ("; iss" "ue 4 targets: fwd+bwd", "; targets: fwd+bwd"),
    ("iss" "ue 18's peer: the 1036 px", "target, the PyTorch peer: the 1036 px"),
]

# Op names older output printed for fused kernels -> the per-op profile's names for them now (an
# op's fusions are its options, each a row "op+option": kernels/dispatch.c). In a table (two or
# more spaces after the name) the spaces shrink or grow so the columns after it stay in place.
OP_LABELS = [
    ("linear_residual_fwd", "linear_fwd+res"),
    ("linear_gelu_fwd", "linear_fwd+gelu_out"),
    ("silu_linear_fwd", "linear_fwd+silu_in"),
    ("linear_gelu_bwd", "linear_bwd+gelu_out"),
    ("linear_dgelu_bwd", "linear_bwd+gelu_in"),
    ("silu_linear_bwd", "linear_bwd+silu_in"),
    ("add_layernorm_fwd", "layernorm_fwd+add"),
]


def relabel(text):
    for old, new in LABELS:
        text = text.replace(old, new)
    for old, new in OP_LABELS:
        def same_width(m, old=old, new=new):
            spaces = m.group(1)
            if len(spaces) < 2:
                return new + spaces
            return new + " " * max(1, len(old) + len(spaces) - len(new))
        text = re.sub(r"\b" + re.escape(old) + r"\b( *)", same_width, text)
    return text


def paste(path, tag, text):
    """Replaces what lies between <!-- {tag}begin --> and <!-- {tag}end --> in path by text
    (relabelled)."""
    text = relabel(text)
    doc = open(path).read()
    begin, end = f"<!-- {tag}begin -->", f"<!-- {tag}end -->"
    if begin not in doc or end not in doc:
        sys.exit(f"{path} has no {begin} / {end} markers")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    open(path, "w").write(head + begin + "\n```\n" + text + "\n```\n" + end + tail)
    print(f"{path}: {begin} section replaced")


def sections(text):
    """The `== cgspn bench NAME [OPTIONS]` sections of a bench output: {"NAME [OPTIONS]": [lines
    after the == line]} ("vit", "distill --memory=1", ...)."""
    out, name = {}, None
    for line in text.split("\n"):
        m = re.match(r"== cgspn bench (\w+.*?)\s*$", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name:
            out[name].append(line)
    return out


def first(lines, pattern, frm=0):
    """Index of the first line at or after frm that matches pattern, or None."""
    return next((k for k in range(frm, len(lines)) if re.match(pattern, lines[k])), None)


def section_with(s, name, option):
    """The lines of the first section NAME whose options include OPTION (None when absent)."""
    return next((v for k, v in s.items() if k.split()[0] == name and option in k.split()[1:]), None)


def headline(text):
    """The headline excerpt of a `make bench` output, or None when a part is missing."""
    s = sections(text)
    vit, block = s.get("vit"), s.get("block")
    if not vit or not block:
        return None
    # bench vit: the step table through the PyTorch table's "(ratios are ..." line.
    a = first(vit, r"model\s+img\s+batch")
    b = None if a is None else first(vit, r"\(ratios are", a)
    # bench block: the block table through the last line of the speed-ups table.
    c = first(block, r"\s+px\s+tokens\s+block")
    d = None if c is None else first(block, r"speed-ups", c)
    e = None if d is None else first(block, r"\s*$", d)
    if None in (a, b, c, d):
        return None
    e = len(block) if e is None else e
    out = (["== cgspn bench vit", vit[0]] + vit[a:b + 1] +
           ["", "== cgspn bench block", block[0]] + block[c:e])
    # bench distill --memory=1: its first line and the table beside PyTorch's step.
    mem = section_with(s, "distill", "--memory=1")
    f = None if not mem else first(mem, r"\| grad_checkpoint \| batch \| img/s")
    g = None if f is None else first(mem, r"\(PyTorch:", f)
    if g is not None:
        out += ["", "== cgspn bench distill --memory=1", mem[0]] + mem[f:g + 1]
    # bench distill --max-batch: its first line, the table and the PyTorch peer line.
    mb = section_with(s, "distill", "--max-batch")
    h = None if not mb else first(mb, r"\| px \| grad_checkpoint \| max batch")
    k = None if h is None else first(mb, r"\(max batch:", h)
    if k is not None:
        peer = first(mb, r"target, the PyTorch peer", k)
        out += ["", "== cgspn bench distill --max-batch", mb[0]] + mb[h:k + 1]
        if peer is not None:
            out.append(mb[peer])
    return "\n".join(out)


def classify_excerpt(text):
    """From a `cgspn bench classify` section: its header line, the gspn table, the timm table, the
    ratio lines and the ms-per-GMAC line (None when absent)."""
    c = sections(text).get("classify")
    if not c:
        return None
    a = first(c, r"model\s+img\s+batch")
    b = None if a is None else first(c, r"training step ms per GMAC", a)
    if b is None and a is not None:   # an output from before the ms-per-GMAC line
        b = first(c, r"gspn_t / convnext_tiny", a)
    if b is None:
        return None
    return "\n".join(["== cgspn bench classify", c[0]] + c[a:b + 1])


def main(argv):
    doc = DEFAULT_DOC
    args = []
    k = 0
    while k < len(argv):
        if argv[k] == "--doc" and k + 1 < len(argv):
            doc = argv[k + 1]
            k += 2
        elif argv[k].startswith("--doc="):
            doc = argv[k].split("=", 1)[1]
            k += 1
        elif argv[k] in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            args.append(argv[k])
            k += 1
    src = args[0] if len(args) > 0 else "build/bench.txt"
    name = args[1] if len(args) > 1 else ""
    text = relabel(open(src).read().rstrip())
    paste(doc, f"bench:{name}:" if name else "bench:", text)
    print(f"  from {src}")
    cl = classify_excerpt(text)
    if cl is not None:
        paste(README, "bench:classify-headline:", cl)
    h = headline(text)
    if h is None and name:
        return 0   # a run of other benchmarks (distill under mpirun, curriculum): no headline
    if h is None:
        print(f"{README}: headline left as it is ({src} has no complete `bench vit` and `bench block` tables)")
        return 0
    paste(README, "bench:headline:", h)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
