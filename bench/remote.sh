#!/usr/bin/env bash
# Remote-mode benchmark, in one run against `dtlto-reapi serve` on loopback:
#   local           dtlto-reapi --jobs=N, local mode (the baseline)
#   remote-cold     a fresh server (--workers N, empty cache), every job executed remotely
#   remote-cached   the same server again: a relink (new PIDs, new temporary names), every job a hit
#   remote-rerun    the same server, one backend flag changed: every job executed again, with the
#                   compiler already in the CAS (remote-cold uploads it), for the CPU cost per job
#   fresh-dir       the objects copied to a new build directory, linked against the warm server
#   lld-cache-warm  lld's own cache: in-process ThinLTO relink with a warm --thinlto-cache-dir
# For each: best wall time of the whole link (clang + lld + distributor) over RUNS runs, and for the
# dtlto-reapi variants the distributor's own wall time and CPU time per job (from --stats-json). Ratios are to `local`,
# and fresh-dir is also compared to lld-cache-warm. Outputs go to bench/out/remote/ (gitignored).
#
# Environment: MODULES (300), FUNCTIONS per module (16), JOBS (nproc), RUNS (3).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
source "$root/bench/project.sh"
modules=${MODULES:-300}
functions=${FUNCTIONS:-16}
jobs=${JOBS:-$(nproc)}
runs=${RUNS:-3}
out=$root/bench/out/remote
project=$out/project

generate_project
cd "$project"

trap stop_server EXIT

# link NAME DIR [distributor args...]: links DIR's objects, records whole-link and distributor times;
# $backend_flag, when set, is added to every backend compile.
backend_flag=
link() {
    local name=$1 dir=$2
    shift 2
    local args=("${compiler_flags[@]}" -fthinlto-distributor="$distributor"
        -Xthinlto-distributor=--jobs="$jobs" -Xthinlto-distributor=--stats-json="$out/$name.stats.json")
    [[ -z $backend_flag ]] || args+=("-Wl,--thinlto-remote-compiler-arg=$backend_flag")
    for a in "$@"; do args+=("-Xthinlto-distributor=$a"); done
    local start=$EPOCHREALTIME
    (cd "$dir" && "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin "-fuse-ld=$LLD" @inputs.rsp -o "$name" "${args[@]}") \
        >"$out/$name.log" 2>&1 || { cat "$out/$name.log" >&2; exit 1; }
    local end=$EPOCHREALTIME
    local own
    # The distributor's own wall time (s) and CPU time per job (ms).
    own=$(python3 -c 'import json,sys; s = json.load(open(sys.argv[1])); print(s["wall_ms"] / 1000, s["cpu_ms"] / len(s["jobs"]))' "$out/$name.stats.json")
    printf '%s\t%s\t%s\t%s\n' "$name" "$(python3 -c "print($end - $start)")" $own >>"$out/times.tsv"
}

lld_cache_link() { # name cache-dir
    local start=$EPOCHREALTIME
    "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin "-fuse-ld=$LLD" @inputs.rsp -o "$1" \
        "-Wl,--thinlto-jobs=$jobs" "-Wl,--thinlto-cache-dir=$2" >"$out/$1.log" 2>&1
    local end=$EPOCHREALTIME
    printf '%s\t%s\t-\t-\n' "$1" "$(python3 -c "print($end - $start)")" >>"$out/times.tsv"
}

say "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) on $(nproc) cores"
: >"$out/times.tsv"
link warmup "$project" # page cache
: >"$out/times.tsv"
for round in $(seq "$runs"); do
    link local "$project"
    start_server
    link remote-cold "$project" --remote="$server_url" --strategy=remote
    link remote-cached "$project" --remote="$server_url" --strategy=remote
    backend_flag=-fno-slp-vectorize link remote-rerun "$project" --remote="$server_url" --strategy=remote
    fresh=$out/fresh-$round
    copy_objects "$fresh"
    link fresh-dir "$fresh" --remote="$server_url" --strategy=remote
    rm -rf "$out/lld-cache" && lld_cache_link lld-cache-cold "$out/lld-cache"
    lld_cache_link lld-cache-warm "$out/lld-cache"
    say "round $round of $runs done"
done
stop_server
say "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

expected=$(./local)
for name in remote-cold remote-cached remote-rerun lld-cache-warm; do
    [[ $(./"$name") == "$expected" ]] || { say "$name printed something else than local"; exit 1; }
done
[[ $("$out/fresh-$runs/fresh-dir") == "$expected" ]] || { say "fresh-dir printed something else"; exit 1; }
for name in remote-cached fresh-dir; do
    python3 - "$out/$name.stats.json" "$name" <<'PY'
import json, sys
jobs = json.load(open(sys.argv[1]))["jobs"]
misses = [j["module"] for j in jobs if j["ran"] != "action-cache"]
if misses:
    sys.exit(f"{sys.argv[2]}: {len(misses)} jobs were not cache hits, e.g. {misses[:3]}")
PY
done

echo "$modules modules x $functions functions, N=$jobs, loopback server with $jobs workers, best of $runs"
python3 - "$out/times.tsv" <<'PY'
import sys, collections
link, own, cpu = (collections.defaultdict(list) for _ in range(3))
for line in open(sys.argv[1]):
    name, total, mine, cpu_per_job = line.split()
    link[name].append(float(total))
    if mine != "-":
        own[name].append(float(mine))
        cpu[name].append(float(cpu_per_job))
best = {n: min(t) for n, t in link.items()}
print(f"{'variant':<16}{'link s':>9}{'dtlto-reapi s':>15}{'CPU ms/job':>12}{'link / local':>14}")
for name in ("local", "remote-cold", "remote-cached", "remote-rerun", "fresh-dir", "lld-cache-cold", "lld-cache-warm"):
    mine = f"{min(own[name]):.3f}" if own[name] else "-"
    per_job = f"{min(cpu[name]):.2f}" if cpu[name] else "-"
    print(f"{name:<16}{best[name]:>9.2f}{mine:>15}{per_job:>12}{best[name] / best['local']:>14.3f}")
print(f"fresh-dir / lld-cache-warm: {best['fresh-dir'] / best['lld-cache-warm']:.3f}")
PY
