#!/usr/bin/env python3
"""The least a parallel DTLTO distributor can do, as bench/local.sh's baseline: run every job's
`common.args + job.args` on a pool of --jobs=N workers (default: all cores). No checks, no stats."""
import json, os, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

workers = next((int(a[7:]) for a in sys.argv[1:-1] if a.startswith("--jobs=")), os.cpu_count())
with open(sys.argv[-1]) as f:
    spec = json.load(f)
run = lambda job: subprocess.run(spec["common"]["args"] + job["args"]).returncode
with ThreadPoolExecutor(workers) as pool:
    sys.exit(1 if any(list(pool.map(run, spec["jobs"]))) else 0)
