#!/usr/bin/env python3
"""Plots a cgspn run's metrics.jsonl as PNG curves.

    tools/plot_metrics.py RUN [RUN ...] [--out DIR]

RUN is a run folder (checkpoints/NAME, holding metrics.jsonl) or a metrics.jsonl file. Writes,
into --out (default: the first run's folder):

    loss.png       training loss (the mean of each log window) and test loss, against step
    accuracy.png   test top-1 and top-5 (and the EMA weights' when the run kept an EMA)
    lr.png         learning rate against step

Several runs are drawn on the same axes, labelled by folder name. Needs matplotlib (Debian's
python3-matplotlib); the PNGs are written headless (Agg backend).
"""
import argparse
import json
import math
import os
import sys


def load(path):
    """The records of a metrics.jsonl, in order; later records of a step (a resumed run
    repeats none, but a restarted one may) replace earlier ones key by key."""
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"plot_metrics: {path}:{n}: not JSON ({e}); a run killed mid-line? "
                         f"delete the last line")
    return path, rows


def series(rows, key):
    """(steps, values) of the records that hold key, finite values only."""
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(r["step"])
            ys.append(v)
    return xs, ys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders or metrics.jsonl files")
    ap.add_argument("--out", help="folder for the PNGs (default: the first run's folder)")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_metrics: needs matplotlib: apt-get install python3-matplotlib, and run it "
                 "with Debian's /usr/bin/python3 (" + sys.executable + " has no matplotlib)")

    runs = []
    for r in args.runs:
        path, rows = load(r)
        name = os.path.basename(os.path.dirname(os.path.abspath(path)))
        runs.append((name, rows))
    out = args.out or os.path.dirname(os.path.abspath(load(args.runs[0])[0]))
    os.makedirs(out, exist_ok=True)

    def figure(fname, title, ylabel, curves, percent=False, log_y=False):
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
        drawn = 0
        for name, rows in runs:
            for key, label, style in curves:
                xs, ys = series(rows, key)
                if not xs:
                    continue
                if percent:
                    ys = [100 * y for y in ys]
                lab = label if len(runs) == 1 else f"{name}: {label}"
                ax.plot(xs, ys, style, label=lab, linewidth=1.4, markersize=3)
                drawn += 1
        if not drawn:
            plt.close(fig)
            return None
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        if log_y:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = os.path.join(out, fname)
        fig.savefig(path)
        plt.close(fig)
        return path

    written = [
        figure("loss.png", "loss", "cross-entropy",
               [("loss", "train (log window mean)", "-"), ("test_loss", "test", "o-"),
                ("ema_loss", "test, EMA weights", "s--")]),
        figure("accuracy.png", "test accuracy", "%",
               [("test_top1", "top-1", "o-"), ("test_top5", "top-5", "o:"),
                ("ema_top1", "top-1, EMA weights", "s--"), ("ema_top5", "top-5, EMA weights", "s:")],
               percent=True),
        figure("lr.png", "learning rate", "lr", [("lr", "lr", "-")]),
    ]
    for p in written:
        if p:
            print(p)
    if not any(written):
        sys.exit("plot_metrics: no metrics to plot")


if __name__ == "__main__":
    main()
