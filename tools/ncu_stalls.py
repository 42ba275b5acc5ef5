#!/usr/bin/env python3
"""Where a kernel's warps wait: the warp-stall samples of one Nsight Compute report, per SASS
instruction, summed by reason, by opcode and by how many times an instruction ran.

    ncu --set full --import-source yes --section SourceCounters -k regex:NAME --launch-count 1 -o rep ./cgspn ...
    ncu -i rep.ncu-rep --page source --csv --print-source sass > src.csv
    python3 tools/ncu_stalls.py src.csv [--top N]

Prints the samples and instructions in all; the stall reasons over the kernel; samples and
instructions by opcode; samples by how many times an instruction ran (a kernel's phases: an
instruction that runs once a block in some warps, once a chunk in others, falls in its own
class); and the N instructions that drew the most samples, each with its leading reasons.
"""
import argparse
import collections
import csv
import sys

ALL = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def read_rows(path):
    """The per-instruction rows of the report's source page, as dicts (header: the row whose first
    cell is "Address"; a kernel-name line may come before it)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    for i, r in enumerate(rows):
        if r and r[0] == "Address":
            header = r
            break
    else:
        sys.exit(f"ncu_stalls: {path} has no header row starting with \"Address\" "
                 "(ncu -i REPORT --page source --csv --print-source sass writes one)")
    for name in (ALL, EXECUTED, "Source"):
        if name not in header:
            sys.exit(f"ncu_stalls: {path} has no column \"{name}\" (profile with --section SourceCounters)")
    out = []
    for r in rows[i + 1:]:
        if len(r) != len(header):
            continue
        out.append(dict(zip(header, r)))
    return header, out


def number(s):
    try:
        return int(float(s))
    except ValueError:
        return 0


def opcode(source):
    """SASS opcode without predicate and modifiers: "@!P0 BRA 0x..." -> BRA."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def summarize(header, rows, top, out):
    reasons = [h for h in header if h.startswith("stall_") and "(Not Issued)" not in h]
    total = sum(number(r[ALL]) for r in rows)
    executed = sum(number(r[EXECUTED]) for r in rows)
    print(f"samples {total}, warp instructions executed {executed}", file=out)
    if total == 0:
        return
    by_reason = collections.Counter()
    by_op, op_inst, by_count = collections.Counter(), collections.Counter(), collections.Counter()
    for r in rows:
        s = number(r[ALL])
        for k in reasons:
            by_reason[k] += number(r[k])
        op = opcode(r["Source"])
        by_op[op] += s
        op_inst[op] += number(r[EXECUTED])
        by_count[number(r[EXECUTED])] += s
    print("stall reasons:", file=out)
    for k, s in by_reason.most_common(10):
        print(f"  {k:24s} {s:8d} {100.0 * s / total:5.1f}%", file=out)
    print("by opcode (samples, instructions executed):", file=out)
    for op, s in by_op.most_common(20):
        print(f"  {op:12s} {s:8d} {100.0 * s / total:5.1f}%  {op_inst[op]:12d}", file=out)
    print("by how many times an instruction ran (the kernel's phases):", file=out)
    for n, s in by_count.most_common(10):
        print(f"  ran {n:10d} times: {s:8d} samples {100.0 * s / total:5.1f}%", file=out)
    print(f"top {top} instructions (samples, times run, leading reasons):", file=out)
    for r in sorted(rows, key=lambda r: -number(r[ALL]))[:top]:
        lead = sorted(((number(r[k]), k) for k in reasons), reverse=True)[:2]
        why = ", ".join(f"{k} {v}" for v, k in lead if v > 0)
        print(f"  {number(r[ALL]):7d} {number(r[EXECUTED]):10d}  {r['Source'].strip()[:70]}  [{why}]", file=out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu -i REPORT --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=30, help="instructions to list (default 30)")
    args = ap.parse_args()
    header, rows = read_rows(args.csv)
    summarize(header, rows, args.top, sys.stdout)


if __name__ == "__main__":
    main()
