#!/usr/bin/env python3
"""The floor of the DTLTO path, as bench/scaling.sh's baseline: a distributor that compiles nothing
and only copies ready objects into place. With FLOOR_STORE=DIR and FLOOR_RECORD=1 it runs every
job (like bench/minimal_distributor.py, --jobs=N at once) and keeps each object in DIR under its
module's path; with FLOOR_DELEGATE=COMMAND as well, COMMAND (another distributor, given this one's
arguments) runs the jobs instead and their objects are kept, so that one cold link fills both
(bench/scaling.sh's largest sizes compile everything once, not twice); without FLOOR_RECORD it
copies DIR's object of each job's module to the job's output. lld still writes the job file and the index shards and links the objects: what is left is
what any distributor pays. No checks, no stats."""
import json, os, shutil, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

store = os.environ["FLOOR_STORE"]
record = os.environ.get("FLOOR_RECORD") == "1"
workers = next((int(a[7:]) for a in sys.argv[1:-1] if a.startswith("--jobs=")), os.cpu_count())
with open(sys.argv[-1]) as f:
    spec = json.load(f)
kept = lambda job: os.path.join(store, job["inputs"][0].replace("/", "%"))


def run(job):
    if not record:
        shutil.copyfile(kept(job), job["outputs"][0])
        return 0
    code = subprocess.run(spec["common"]["args"] + job["args"]).returncode
    if code == 0:
        shutil.copyfile(job["outputs"][0], kept(job))
    return code


os.makedirs(store, exist_ok=True)
delegate = os.environ.get("FLOOR_DELEGATE")
if record and delegate:
    code = subprocess.run([delegate, *sys.argv[1:]]).returncode
    if code == 0:
        for job in spec["jobs"]:
            shutil.copyfile(job["outputs"][0], kept(job))
    sys.exit(code)
if not record:
    # One thread: copies are system calls, and a pool only adds contention for the interpreter.
    sys.exit(max(map(run, spec["jobs"]), default=0))
with ThreadPoolExecutor(workers) as pool:
    sys.exit(1 if any(list(pool.map(run, spec["jobs"]))) else 0)
