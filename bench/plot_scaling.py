#!/usr/bin/env python3
"""Draws bench/out/scaling/results.tsv (written by bench/scaling.sh) as a PNG: whole-link wall time
of each variant against the number of modules, log-log.

Usage: plot_scaling.py RESULTS.tsv OUTPUT.png   (needs matplotlib)
"""
import collections
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

series = collections.defaultdict(list)
for line in open(sys.argv[1]):
    modules, name, seconds, _ = line.split()
    series[name].append((int(modules), float(seconds)))

labels = {
    "floor": "floor (copy ready objects)",
    "remote-cached": "dtlto-reapi, cached relink",
    "fresh-dir": "dtlto-reapi, fresh directory, warm cache",
    "lld-cache-warm": "lld's own warm cache (in-process)",
}
fig, ax = plt.subplots(figsize=(7, 4.5))
for name, label in labels.items():
    points = sorted(series[name])
    ax.plot([m for m, _ in points], [s for _, s in points], marker="o", label=label)
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("modules (backend jobs)")
ax.set_ylabel("whole link, wall seconds")
ax.set_title("Fully cached links: dtlto-reapi against the floor of the DTLTO path")
ax.grid(True, which="both", alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=100)
