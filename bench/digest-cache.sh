#!/usr/bin/env bash
# What the digest cache's size costs a small link: a link of a small project (every job an
# action-cache hit against `dtlto-reapi serve` on loopback) with two digest caches, interleaved
# round by round — `small`, holding only what this project's links put there, and `big`, the same
# plus ENTRIES synthetic file entries (valid lines with their checksums, distinct inodes, as a
# machine that has linked a large project holds), each in the part its path hashes to. A link reads
# only the parts of its own files, so the difference is what a link pays for everything else the
# machine has linked. Prints the median, over RUNS rounds, of the distributor's CPU (`cpu_ms` of
# --stats-json) and the link's wall time for each cache, and each cache's size.
#
# Environment: MODULES (8), FUNCTIONS per module (4), ENTRIES (90000), RUNS (9), JOBS (nproc),
# DISTRIBUTOR (the dtlto-reapi binary to measure; default: this checkout's release build; a build
# from before the cache was split in parts, which kept it in one file, `file-digests-v3`, works too).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
source "$root/bench/project.sh"
modules=${MODULES:-8}
functions=${FUNCTIONS:-4}
entries=${ENTRIES:-90000}
runs=${RUNS:-9}
jobs=${JOBS:-$(nproc)}
distributor=${DISTRIBUTOR:-$distributor}
out=$root/bench/out/digest-cache
project=$out/project
trap stop_server EXIT

generate_project
start_server
cd "$project"
# link CACHE LABEL: one link with XDG_CACHE_HOME=$out/CACHE, every job an action-cache hit once
# the first link of the run has executed them; its stats are kept under LABEL.
link() {
    local stats=$out/$2.stats.json start end
    sync
    start=$EPOCHREALTIME
    XDG_CACHE_HOME=$out/$1 "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin "-fuse-ld=$LLD" @inputs.rsp -o "prog-$1" \
        "${compiler_flags[@]}" -fthinlto-distributor="$distributor" -Xthinlto-distributor=--remote="$server_url" \
        -Xthinlto-distributor=--strategy=remote -Xthinlto-distributor=--stats-json="$stats" >"$out/$2.log" 2>&1 ||
        { cat "$out/$2.log" >&2; exit 1; }
    end=$EPOCHREALTIME
    python3 -c 'import json, sys; print(sys.argv[2], json.load(open(sys.argv[1]))["cpu_ms"], float(sys.argv[4]) - float(sys.argv[3]))' \
        "$stats" "$1" "$start" "$end" >>"$out/times.tsv"
}

# Both caches first learn the compiler's and the project's digests (and the cluster the project).
for cache in small big; do
    mkdir -p "$out/$cache" && chmod 700 "$out/$cache"
    link "$cache" "warm-$cache"
done
# The cache as the build keeps it: a directory of parts, or (before) one file.
digests=dtlto-reapi/file-digests-v4
[[ -d "$out/big/$digests" ]] || digests=dtlto-reapi/file-digests-v3
say "adding $entries synthetic entries to the big cache ($digests)"
python3 - "$out/big/$digests" "$entries" <<'PY'
import hashlib, os, sys, time
path, count = sys.argv[1], int(sys.argv[2])
now = int(time.time())
lines = {}
for n in range(count):
    # dev ino size mtime ctime last-used sha256 size module-hash path, as a real entry.
    file = f"/synthetic/project/dir{n // 1000}/m{n:05d}.o"
    rest = (f"65024 {900_000_000 + n} 5992 1796531580373518436 1796531580373518436 {now} "
            f"{hashlib.sha256(str(n).encode()).hexdigest()} 5992 {n:040x} {file}")
    line = f"{hashlib.sha256(rest.encode()).hexdigest()[:16]} {rest}\n"
    # A part holds the entries whose path's SHA-256 starts with its name.
    part = hashlib.sha256(file.encode()).hexdigest()[:2] if os.path.isdir(path) else ""
    lines.setdefault(part, []).append(line)
for part, part_lines in lines.items():
    file = os.path.join(path, part) if part else path
    if not os.path.exists(file):
        with open(file, "w") as new:
            new.write("dtlto-reapi digest cache v4\n")
    with open(file, "a") as cache:
        cache.writelines(part_lines)
PY
: >"$out/times.tsv"
for round in $(seq "$runs"); do
    for cache in small big; do link "$cache" "$cache-$round"; done
done
say "$modules modules x $functions functions, every job an action-cache hit, --jobs=$jobs, $runs rounds"
python3 - "$out/times.tsv" "$out/small/$digests" "$out/big/$digests" <<'PY'
import os, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    cache, cpu_ms, wall = line.split()
    rows.setdefault(cache, []).append((float(cpu_ms), float(wall)))
def files(path):
    return [os.path.join(path, part) for part in os.listdir(path)] if os.path.isdir(path) else [path]
print(f"{'cache':<7}{'files':>6}{'kB':>9}{'lines':>9}{'distributor CPU ms':>20}{'link s':>9}")
for cache, path in zip(("small", "big"), sys.argv[2:]):
    parts = files(path)
    size = sum(os.path.getsize(part) for part in parts)
    lines = sum(sum(1 for _ in open(part, "rb")) for part in parts)
    cpu = statistics.median(r[0] for r in rows[cache])
    wall = statistics.median(r[1] for r in rows[cache])
    print(f"{cache:<7}{len(parts):>6}{size / 1e3:>9.0f}{lines:>9}{cpu:>20.1f}{wall:>9.3f}")
PY
