#!/usr/bin/env python3
"""Draws bench/out/scaling/results.tsv (written by bench/scaling.sh) as a PNG: on the left,
dtlto-reapi's CPU time per job (cold link against serve, and all-hit relink) against the number of
modules, for each import shape; on the right, the whole-link wall time of the all-hit relink and of
the floor. Flat lines on the left mean a job costs the same at any size.

Usage: plot_scaling.py RESULTS.tsv OUTPUT.png   (needs matplotlib)
"""
import collections
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    shape, modules, name, seconds, _, per_job, *_ = line.split()
    rows[(int(shape), name)].append((int(modules), float(seconds), per_job))

fig, (cost, wall) = plt.subplots(1, 2, figsize=(11, 4.5))
for (shape, name), points in sorted(rows.items()):
    points.sort()
    label = f"IMPORTS={shape}, "
    if name in ("fill-server", "remote-cached"):
        kept = [(m, float(c)) for m, _, c in points if c != "-"]
        what = "cold link" if name == "fill-server" else "all-hit relink"
        cost.plot([m for m, _ in kept], [c for _, c in kept], marker="o", label=label + what)
    if name in ("floor", "remote-cached"):
        what = "floor" if name == "floor" else "dtlto-reapi all-hit relink"
        wall.plot([m for m, _, _ in points], [s for _, s, _ in points], marker="o", label=label + what)
for ax in (cost, wall):
    ax.set_xscale("log")
    ax.set_xlabel("modules (backend jobs)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
cost.set_ylabel("dtlto-reapi CPU ms per job (user + system)")
cost.set_title("Cost per job")
wall.set_yscale("log")
wall.set_ylabel("whole link, wall seconds")
wall.set_title("All-hit relink against the floor")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=100)
