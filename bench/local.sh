#!/usr/bin/env bash
# Local-mode benchmark: how much does dtlto-reapi cost over the least a parallel distributor can do?
#
# Generates a C project (bench/gen_project.py; default 300 modules with real work in each), compiles it
# once with -flto=thin, then times three links of it, interleaved round by round so that a change of
# machine load hits every variant alike (best of RUNS, after one warm-up round):
#   1. in-process ThinLTO          -Wl,--thinlto-jobs=N
#   2. bench/minimal_distributor.py --jobs=N   (the baseline)
#   3. dtlto-reapi --jobs=N (local mode)
# and prints a table of wall and CPU seconds and ratios to (2); CPU time (of the link and every
# process it starts) is the steadier figure on a machine shared with other work. Everything goes to
# bench/out/local/ (gitignored).
#
# Environment: MODULES (300), FUNCTIONS per module (16), JOBS (nproc), RUNS (3).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
source "$root/bench/project.sh"
modules=${MODULES:-300}
functions=${FUNCTIONS:-16}
jobs=${JOBS:-$(nproc)}
runs=${RUNS:-3}
out=$root/bench/out/local
project=$out/project

generate_project
cd "$project"

link=(--target=x86_64-linux-gnu -O2 -flto=thin "-fuse-ld=$LLD" @inputs.rsp)
dtlto=("${compiler_flags[@]}" "-Xthinlto-distributor=--jobs=$jobs")
variant_names=(in-process minimal dtlto-reapi)
link_variant() { # name
    case $1 in
    in-process) "$CLANG" "${link[@]}" -o in-process "-Wl,--thinlto-jobs=$jobs" ;;
    minimal) "$CLANG" "${link[@]}" -o minimal "${dtlto[@]}" \
        "-fthinlto-distributor=$root/bench/minimal_distributor.py" ;;
    dtlto-reapi) "$CLANG" "${link[@]}" -o dtlto-reapi "${dtlto[@]}" "-fthinlto-distributor=$distributor" ;;
    esac
}

say "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) on $(nproc) cores"
: >"$out/times.tsv"
TIMEFORMAT='%R %U %S' # wall, user and system seconds of the link and every process it started
for round in $(seq 0 "$runs"); do
    for name in "${variant_names[@]}"; do
        { time link_variant "$name" >"$out/$name.log" 2>&1; } 2>"$out/time" ||
            { cat "$out/$name.log" >&2; exit 1; }
        # Round 0 warms the page cache and is not counted.
        [[ $round == 0 ]] || echo "$name $(cat "$out/time")" >>"$out/times.tsv"
    done
    [[ $round == 0 ]] || say "round $round of $runs done"
done
say "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

expected=$(./in-process)
for name in minimal dtlto-reapi; do
    [[ $(./"$name") == "$expected" ]] || { say "$name printed something else than in-process"; exit 1; }
done

echo "$modules modules x $functions functions, N=$jobs, $runs rounds; CPU = user + system seconds of the link and its children"
python3 - "$out/times.tsv" <<'PY'
import sys, collections
wall, cpu = collections.defaultdict(list), collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, real, user, system = line.split()
    wall[name].append(float(real))
    cpu[name].append(float(user) + float(system))
mean = lambda xs: sum(xs) / len(xs)
base_wall, base_cpu = min(wall["minimal"]), mean(cpu["minimal"])
print(f"{'variant':<14}{'best wall s':>13}{'mean wall s':>13}{'mean CPU s':>12}{'wall / minimal':>16}{'CPU / minimal':>15}")
for name in ("in-process", "minimal", "dtlto-reapi"):
    w, c = wall[name], cpu[name]
    print(f"{name:<14}{min(w):>13.2f}{mean(w):>13.2f}{mean(c):>12.2f}{min(w) / base_wall:>16.3f}{mean(c) / base_cpu:>15.3f}")
PY
