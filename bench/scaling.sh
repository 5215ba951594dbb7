#!/usr/bin/env bash
# How the cached relink scales against the floor of the DTLTO path, at each size in SIZES:
#   floor           bench/floor_distributor.py copying ready objects into place (the baseline)
#   remote-cached   dtlto-reapi relinking against a warm `dtlto-reapi serve` (every job a hit)
#   fresh-dir       the objects copied to a new build directory, linked against the warm server
#   lld-cache-warm  in-process ThinLTO with a warm --thinlto-cache-dir (no distributor at all)
# Best whole-link wall time over RUNS rounds (variants interleaved), dtlto-reapi's own time (from
# --stats-json), and ratios to `floor`; rows also go to bench/out/scaling/results.tsv, which
# bench/plot_scaling.py draws.
#
# Environment: SIZES ("300 1000"), FUNCTIONS per module (1), JOBS (nproc), RUNS (3).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
source "$root/bench/project.sh"
sizes=${SIZES:-300 1000}
functions=${FUNCTIONS:-1}
jobs=${JOBS:-$(nproc)}
runs=${RUNS:-3}
results=$root/bench/out/scaling/results.tsv
trap stop_server EXIT

# timed NAME DIR CMD...: runs CMD in DIR, appends "NAME seconds" to $out/times.tsv.
timed() {
    local name=$1 dir=$2
    shift 2
    local start=$EPOCHREALTIME
    (cd "$dir" && "$@") >"$out/$name.log" 2>&1 || { cat "$out/$name.log" >&2; exit 1; }
    printf '%s\t%s\n' "$name" "$(python3 -c "print($EPOCHREALTIME - $start)")" >>"$out/times.tsv"
}
clang_link() { # OUTPUT ARGS...: the link of inputs.rsp
    local output=$1
    shift
    "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin "-fuse-ld=$LLD" @inputs.rsp -o "$output" "$@"
}
distributed() { # OUTPUT DISTRIBUTOR ARGS...
    local output=$1 distributor=$2
    shift 2
    local args=(-Wl,--thinlto-remote-compiler="$CLANG" -fthinlto-distributor="$distributor"
        -Xthinlto-distributor=--jobs="$jobs")
    for a in "$@"; do args+=("-Xthinlto-distributor=$a"); done
    clang_link "$output" "${args[@]}"
}

say "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) on $(nproc) cores"
mkdir -p "$(dirname "$results")"
: >"$results"
for modules in $sizes; do
    out=$root/bench/out/scaling/$modules
    project=$out/project
    generate_project
    : >"$out/times.tsv"
    # Fill the three caches: the floor's objects, the server's action cache, lld's cache.
    export FLOOR_STORE=$out/floor-store
    FLOOR_RECORD=1 timed fill-floor "$project" distributed fill-floor "$root/bench/floor_distributor.py"
    start_server
    timed fill-server "$project" distributed fill-server "$distributor" --remote="$server_url"
    timed fill-lld "$project" clang_link fill-lld "-Wl,--thinlto-jobs=$jobs" "-Wl,--thinlto-cache-dir=$out/lld-cache"
    : >"$out/times.tsv"
    for round in $(seq "$runs"); do
        timed floor "$project" distributed floor "$root/bench/floor_distributor.py"
        timed remote-cached "$project" distributed remote-cached "$distributor" \
            --remote="$server_url" --stats-json="$out/remote-cached.stats.json"
        fresh=$out/fresh-$round
        mkdir -p "$fresh" && cp "$project"/*.o "$project/inputs.rsp" "$fresh/"
        timed fresh-dir "$fresh" distributed fresh-dir "$distributor" \
            --remote="$server_url" --stats-json="$out/fresh-dir.stats.json"
        timed lld-cache-warm "$project" clang_link lld-cache-warm "-Wl,--thinlto-jobs=$jobs" \
            "-Wl,--thinlto-cache-dir=$out/lld-cache"
        say "$modules modules: round $round of $runs done"
    done
    stop_server
    expected=$("$project/fill-lld")
    for program in floor remote-cached lld-cache-warm "../fresh-$runs/fresh-dir"; do
        [[ $("$project/$program") == "$expected" ]] || { say "$program printed something else"; exit 1; }
    done
    python3 - "$out" "$modules" >>"$results" <<'PY'
import collections, json, sys
out, modules = sys.argv[1], sys.argv[2]
for name in ("remote-cached", "fresh-dir"):
    jobs = json.load(open(f"{out}/{name}.stats.json"))["jobs"]
    if any(j["ran"] != "action-cache" for j in jobs):
        sys.exit(f"{name}: not every job was a cache hit")
times = collections.defaultdict(list)
for line in open(f"{out}/times.tsv"):
    name, seconds = line.split()
    times[name].append(float(seconds))
own = json.load(open(f"{out}/remote-cached.stats.json"))["wall_ms"] / 1000
for name in ("floor", "remote-cached", "fresh-dir", "lld-cache-warm"):
    print(modules, name, f"{min(times[name]):.3f}", f"{own:.3f}" if name == "remote-cached" else "-", sep="\t")
PY
done
say "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

echo "FUNCTIONS=$functions per module, N=$jobs, loopback server with $jobs workers, best of $runs"
python3 - "$results" <<'PY'
import collections, sys
rows = collections.defaultdict(dict)
own = {}
for line in open(sys.argv[1]):
    modules, name, seconds, mine = line.split()
    rows[int(modules)][name] = float(seconds)
    if mine != "-":
        own[int(modules)] = float(mine)
print(f"{'modules':>8}{'floor s':>9}{'cached s':>10}{'/ floor':>9}{'fresh-dir s':>13}{'/ floor':>9}{'lld warm s':>12}{'dtlto-reapi s':>15}")
for modules in sorted(rows):
    r = rows[modules]
    print(f"{modules:>8}{r['floor']:>9.2f}{r['remote-cached']:>10.2f}{r['remote-cached'] / r['floor']:>9.2f}"
          f"{r['fresh-dir']:>13.2f}{r['fresh-dir'] / r['floor']:>9.2f}{r['lld-cache-warm']:>12.2f}{own[modules]:>15.3f}")
PY
