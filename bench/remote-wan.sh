#!/usr/bin/env bash
# A cold remote link through a distant cluster, with and without zstd: `dtlto-reapi serve`
# throttled to BANDWIDTH per direction and LATENCY_MS per call (--throttle-bandwidth,
# --throttle-latency-ms), a fresh server for every link (empty CAS and action cache):
#   identity   --remote-compression=off
#   zstd       --remote-compression=on (the server offers zstd; `auto` would not compress for a
#              server on this machine)
# For each: best wall time of the whole link over RUNS rounds (variants interleaved), and the
# client's logical and wire bytes (--stats-json `transfers`). Ratios are to `identity`.
#
# Environment: MODULES (100), FUNCTIONS per module (16), JOBS (nproc), RUNS (2),
# BANDWIDTH (50Mbit), LATENCY_MS (20).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
source "$root/bench/project.sh"
modules=${MODULES:-100}
functions=${FUNCTIONS:-16}
jobs=${JOBS:-$(nproc)}
runs=${RUNS:-2}
bandwidth=${BANDWIDTH:-50Mbit}
latency=${LATENCY_MS:-20}
out=$root/bench/out/remote-wan
project=$out/project

generate_project
cd "$project"

trap stop_server EXIT

# link NAME COMPRESSION: a cold link through a fresh throttled server.
link() {
    local name=$1
    start_server --throttle-bandwidth "$bandwidth" --throttle-latency-ms "$latency"
    local args=(-Wl,--thinlto-remote-compiler="$CLANG" -fthinlto-distributor="$distributor"
        -Xthinlto-distributor=--remote="$server_url" -Xthinlto-distributor=--strategy=remote -Xthinlto-distributor=--remote-compression="$2"
        -Xthinlto-distributor=--stats-json="$out/$name.stats.json")
    local start=$EPOCHREALTIME
    "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin "-fuse-ld=$LLD" @inputs.rsp -o "$name" "${args[@]}" \
        >"$out/$name.log" 2>&1 || { cat "$out/$name.log" >&2; exit 1; }
    local end=$EPOCHREALTIME
    python3 - "$out/$name.stats.json" "$name" "$(python3 -c "print($end - $start)")" >>"$out/times.tsv" <<'PY'
import json, sys
stats = json.load(open(sys.argv[1]))
t = stats["transfers"]
misses = [j for j in stats["jobs"] if j["ran"] != "remote"]
if misses:
    sys.exit(f"{sys.argv[2]}: {len(misses)} jobs did not run remotely")
print(sys.argv[2], sys.argv[3], t["bytes_uploaded"], t["wire_bytes_uploaded"],
      t["bytes_downloaded"], t["wire_bytes_downloaded"], sep="\t")
PY
}

say "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) on $(nproc) cores"
: >"$out/times.tsv"
for round in $(seq "$runs"); do
    link identity off
    link zstd on
    say "round $round of $runs done"
done
stop_server
say "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
[[ $(./identity) == "$(./zstd)" ]] || { say "the two programs differ"; exit 1; }

echo "$modules modules x $functions functions, server with $jobs workers at $bandwidth per direction and ${latency} ms per call, cold links, best of $runs"
python3 - "$out/times.tsv" <<'PY'
import sys, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, wall, up, wire_up, down, wire_down = line.split()
    rows[name].append((float(wall), int(up), int(wire_up), int(down), int(wire_down)))
best = {n: min(r) for n, r in rows.items()}
print(f"{'variant':<10}{'link s':>8}{'up MB':>8}{'wire up':>9}{'down MB':>9}{'wire down':>11}{'wire/logical':>14}{'link / identity':>17}")
for name in ("identity", "zstd"):
    wall, up, wup, down, wdown = best[name]
    print(f"{name:<10}{wall:>8.2f}{up/1e6:>8.2f}{wup/1e6:>9.2f}{down/1e6:>9.2f}{wdown/1e6:>11.2f}"
          f"{(wup + wdown) / (up + down):>14.3f}{wall / best['identity'][0]:>17.3f}")
PY
