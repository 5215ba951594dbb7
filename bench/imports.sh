#!/usr/bin/env bash
# What a job costs the distributor when it imports from many modules, as real C and C++ code does:
# one generated project whose modules each call into IMPORTS others (bench/gen_project.py), so every
# backend job lists ~IMPORTS+2 inputs, linked against `dtlto-reapi serve` on loopback in interleaved
# rounds of:
#   cold          a fresh server that already holds the compiler (a one-module program was linked
#                 through it first): every job executed remotely
#   cached        a relink in the same directory against that server: every job an action-cache hit
#   fresh-dir     the objects copied to a new build directory, linked against the same server
#   floor         bench/floor_distributor.py copying ready objects into place (the baseline: what any
#                 distributor pays, clang and lld included)
#   disk-cached   local mode with a warm --disk-cache and no server: every job a disk-cache hit
# It prints the best whole-link wall time, the distributor's own best wall time and CPU time per job
# (`wall_ms`, `cpu_ms` / jobs from --stats-json), ratios to `floor`, and the inputs per job. It fails
# unless every cached job was a hit and every program prints the same thing.
#
# Environment: MODULES (1000), IMPORTS (100), FUNCTIONS per module (1), JOBS (nproc), RUNS (3),
# COLD_RUNS (RUNS: cold links in the first COLD_RUNS rounds only, as each compiles everything; later
# rounds use the last cold link's server),
# DISTRIBUTOR (the dtlto-reapi binary to measure, e.g. a copy of an older build; default: this
# checkout's release build), KEEP_PROJECT=1 (reuse the project and floor store of an earlier run
# with the same MODULES and IMPORTS instead of generating and compiling them again), OUT
# (bench/out/imports: where the project, the digest cache and the results go; a tmpfs such as
# /dev/shm keeps the file system's own costs of creating files out of the figures).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
source "$root/bench/project.sh"
distributor=${DISTRIBUTOR:-$distributor}
modules=${MODULES:-1000}
export IMPORTS=${IMPORTS:-100}
functions=${FUNCTIONS:-1}
jobs=${JOBS:-$(nproc)}
runs=${RUNS:-3}
cold_runs=${COLD_RUNS:-$runs}
out=${OUT:-$root/bench/out/imports}
project=$out/project
trap stop_server EXIT

if [[ ${KEEP_PROJECT:-} == 1 && -d $project && -d $out/floor-store ]]; then
    say "reusing $project and its floor store (KEEP_PROJECT=1)"
    rm -rf "$out"/fresh-* "$out/disk-cache" "$out/xdg-cache" "$out"/*.stats.json
else
    generate_project
fi
cd "$project"
# The digest cache lives in bench/out, not the user's.
export XDG_CACHE_HOME=$out/xdg-cache

# link NAME DIR DISTRIBUTOR [distributor args...]: links DIR's objects; appends "NAME link-seconds
# own-seconds own-cpu-ms-per-job" to $out/times.tsv ("-" for the floor, which reports nothing).
link() {
    local name=$1 dir=$2 distributor=$3
    shift 3
    local args=("${compiler_flags[@]}" -fthinlto-distributor="$distributor" -Xthinlto-distributor=--jobs="$jobs")
    for a in "$@"; do args+=("-Xthinlto-distributor=$a"); done
    local start=$EPOCHREALTIME
    (cd "$dir" && "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin "-fuse-ld=$LLD" @inputs.rsp -o "$name" "${args[@]}") \
        >"$out/$name.log" 2>&1 || { cat "$out/$name.log" >&2; exit 1; }
    local end=$EPOCHREALTIME own="- -"
    if [[ -f $out/$name.stats.json ]]; then
        own=$(python3 -c 'import json,sys; s = json.load(open(sys.argv[1])); print(s["wall_ms"] / 1000, s["cpu_ms"] / len(s["jobs"]))' "$out/$name.stats.json")
    fi
    printf '%s\t%s\t%s\t%s\n' "$name" "$(python3 -c "print($end - $start)")" $own >>"$out/times.tsv"
}
ours() { # NAME DIR [distributor args...]: link through dtlto-reapi, with --stats-json
    local name=$1 dir=$2
    shift 2
    rm -f "$out/$name.stats.json"
    link "$name" "$dir" "$distributor" --stats-json="$out/$name.stats.json" "$@"
}

say "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) on $(nproc) cores"
# Warm-up, not counted: the floor's objects (compiled locally once per project).
: >"$out/times.tsv"
export FLOOR_STORE=$out/floor-store
[[ -d $FLOOR_STORE ]] || FLOOR_RECORD=1 link fill-floor "$project" "$root/bench/floor_distributor.py"
: >"$out/times.tsv"
for round in $(seq "$runs"); do
    if ((round <= cold_runs)); then # else the last cold link's server, still warm
        seeded_server
        ours cold "$project" --remote="$server_url" --strategy=remote
    fi
    # The disk cache, filled once from the warm server (hits are stored on disk too); not counted.
    [[ -d $out/disk-cache ]] || ours fill-disk "$project" --remote="$server_url" --disk-cache="$out/disk-cache"
    ours cached "$project" --remote="$server_url" --strategy=remote
    fresh=$out/fresh-$round
    copy_objects "$fresh"
    ours fresh-dir "$fresh" --remote="$server_url" --strategy=remote
    link floor "$project" "$root/bench/floor_distributor.py"
    ours disk-cached "$project" --disk-cache="$out/disk-cache"
    say "round $round of $runs done"
done
stop_server
say "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

expected=$(./floor)
for program in cold cached disk-cached "../fresh-$runs/fresh-dir"; do
    [[ $(./"$program") == "$expected" ]] || { say "$program printed something else than floor"; exit 1; }
done
python3 - "$out" <<'PY'
import json, sys
for name, ran in (("cold", "remote"), ("cached", "action-cache"), ("fresh-dir", "action-cache"), ("disk-cached", "disk-cache")):
    jobs = json.load(open(f"{sys.argv[1]}/{name}.stats.json"))["jobs"]
    other = [j["module"] for j in jobs if j["ran"] != ran]
    if other:
        sys.exit(f"{name}: {len(other)} jobs did not run as {ran}, e.g. {other[:3]}")
PY

echo "$modules modules x $functions functions, IMPORTS=$IMPORTS, N=$jobs, loopback server with $jobs workers, best of $runs ($cold_runs for cold)"
python3 - "$out" <<'PY'
import collections, json, sys
out = sys.argv[1]
link, own, cpu = (collections.defaultdict(list) for _ in range(3))
for line in open(f"{out}/times.tsv"):
    name, total, mine, per_job = line.split()
    link[name].append(float(total))
    if mine != "-":
        own[name].append(float(mine))
        cpu[name].append(float(per_job))
jobs = json.load(open(f"{out}/cached.stats.json"))["jobs"]
inputs = [len(j["parts"]["imports"]) + 2 for j in jobs]
print(f"inputs per job (module, index shard, imports): mean {sum(inputs) / len(inputs):.1f}, max {max(inputs)}")
floor = min(link["floor"])
print(f"{'variant':<13}{'link s':>8}{'/ floor':>9}{'dtlto-reapi s':>15}{'CPU ms/job':>12}")
for name in ("floor", "cold", "cached", "fresh-dir", "disk-cached"):
    mine = f"{min(own[name]):.3f}" if own[name] else "-"
    per_job = f"{min(cpu[name]):.2f}" if cpu[name] else "-"
    print(f"{name:<13}{min(link[name]):>8.2f}{min(link[name]) / floor:>9.2f}{mine:>15}{per_job:>12}")
PY
