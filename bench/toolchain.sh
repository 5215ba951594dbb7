#!/usr/bin/env bash
# Toolchain benchmark: what carrying the compiler in every action costs, against `dtlto-reapi serve`
# on loopback, on one generated project:
#   upload-cold      a fresh server (empty CAS): the compiler (185 MB zig) is uploaded, every job
#                    executed
#   compiler-in-cas  a fresh server that already holds the compiler (a one-module program was
#                    linked through it first): every job executed, nothing of the toolchain sent
# For each: best wall time of the whole link and of dtlto-reapi itself (--stats-json) over RUNS
# runs, and the toolchain bytes uploaded. Then the cost of identifying the compiler per link: the
# `identified in` time of --verbose with a cold digest cache (hashing the compiler) and a warm one
# (the target: under 5 ms). The digest cache lives in bench/out (XDG_CACHE_HOME), not the user's.
#
# Environment: MODULES (50), FUNCTIONS per module (4), JOBS (nproc), RUNS (3).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
source "$root/bench/project.sh"
modules=${MODULES:-50}
functions=${FUNCTIONS:-4}
jobs=${JOBS:-$(nproc)}
runs=${RUNS:-3}
out=$root/bench/out/toolchain
project=$out/project

generate_project
export XDG_CACHE_HOME=$out/cache
cd "$project"
trap stop_server EXIT
mkdir -p seed && printf 'int main(void) { return 0; }\n' >seed/seed.c
"$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin -c seed/seed.c -o seed/seed.o


# link NAME [distributor args...]: links the project, records link and distributor times and the
# toolchain bytes uploaded.
link() {
    local name=$1
    shift
    local args=("${compiler_flags[@]}" -fthinlto-distributor="$distributor"
        -Xthinlto-distributor=--stats-json="$out/$name.stats.json")
    for a in "$@"; do args+=("-Xthinlto-distributor=$a"); done
    local start=$EPOCHREALTIME
    "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin "-fuse-ld=$LLD" @inputs.rsp -o "$name" "${args[@]}" \
        >"$out/$name.log" 2>&1 || { cat "$out/$name.log" >&2; exit 1; }
    local end=$EPOCHREALTIME
    python3 - "$out/$name.stats.json" "$name" "$(python3 -c "print($end - $start)")" >>"$out/times.tsv" <<'PY'
import json, sys
stats = json.load(open(sys.argv[1]))
remote = sum(1 for j in stats["jobs"] if j["ran"] == "remote")
if remote != len(stats["jobs"]):
    sys.exit(f"{sys.argv[2]}: only {remote} of {len(stats['jobs'])} jobs ran remotely")
print(sys.argv[2], sys.argv[3], stats["wall_ms"] / 1000, stats["toolchain"]["bytes_uploaded"], sep="\t")
PY
}

say "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) on $(nproc) cores"
: >"$out/times.tsv"
for round in $(seq "$runs"); do
    start_server
    link upload-cold --remote="$server_url" --strategy=remote
    start_server
    (cd seed && "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin "-fuse-ld=$LLD" seed.o -o seed \
        "${compiler_flags[@]}" -fthinlto-distributor="$distributor" -Xthinlto-distributor=--remote="$server_url" -Xthinlto-distributor=--strategy=remote)
    link compiler-in-cas --remote="$server_url" --strategy=remote
    say "round $round of $runs done"
done
stop_server

# Identifying the compiler: cold (nothing remembered) and warm digest cache, local mode with a disk
# cache (which plans Actions, so the compiler is identified) and every job a disk-cache hit.
identify() {
    "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin "-fuse-ld=$LLD" @inputs.rsp -o identify \
        "${compiler_flags[@]}" -fthinlto-distributor="$distributor" -Xthinlto-distributor=--verbose \
        -Xthinlto-distributor=--disk-cache="$out/disk-cache" 2>&1 | sed -n 's/.*identified in \([0-9.]*\) ms.*/\1/p'
}
identify >/dev/null # fills the disk cache
rm -rf "$XDG_CACHE_HOME/dtlto-reapi/file-digests-v4"
cold=$(identify)
warm=()
for _ in $(seq 5); do warm+=("$(identify)"); done

echo "$modules modules x $functions functions, N=$jobs, loopback server with $jobs workers, best of $runs"
python3 - "$out/times.tsv" "$cold" "${warm[@]}" <<'PY'
import sys, collections
link, own, up = collections.defaultdict(list), collections.defaultdict(list), {}
for line in open(sys.argv[1]):
    name, total, mine, uploaded = line.split()
    link[name].append(float(total)); own[name].append(float(mine)); up[name] = int(uploaded)
print(f"{'variant':<17}{'link s':>8}{'dtlto-reapi s':>15}{'toolchain MB up':>17}")
for name in ("upload-cold", "compiler-in-cas"):
    print(f"{name:<17}{min(link[name]):>8.2f}{min(own[name]):>15.3f}{up[name] / 1e6:>17.1f}")
warm = sorted(float(w) for w in sys.argv[3:])
print(f"identifying the compiler: cold digest cache {float(sys.argv[2]):.1f} ms, "
      f"warm {warm[0]:.2f} ms best, {warm[len(warm) // 2]:.2f} ms median of {len(warm)}")
PY
