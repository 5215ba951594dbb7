#!/usr/bin/env bash
# How links scale against the floor of the DTLTO path, at each size in SIZES and each import shape in
# SHAPES (bench/gen_project.py's IMPORTS: 0 is a chain, each job ~3 inputs; 100 is ~102 inputs):
#   fill-server     the cold link that fills a fresh `dtlto-reapi serve` (every job executed there)
#   floor           bench/floor_distributor.py copying ready objects into place (the baseline)
#   remote-cached   dtlto-reapi relinking against the warm server (every job a hit)
#   fresh-dir       the objects copied to a new build directory, linked against the warm server
#   lld-cache-warm  in-process ThinLTO with a warm --thinlto-cache-dir (no distributor at all)
# Best whole-link wall time over RUNS rounds (variants interleaved), dtlto-reapi's own time (from
# --stats-json), its CPU time per job (user + system, from GNU time) and peak RSS, and ratios to
# `floor`; rows also go to bench/out/scaling/results.tsv, which bench/plot_scaling.py draws.
#
# Environment: SIZES ("300 1000"), SHAPES ("0 100"), FUNCTIONS per module (1), JOBS (nproc),
# RUNS (3). Needs GNU time (/usr/bin/time).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
source "$root/bench/project.sh"
sizes=${SIZES:-300 1000}
shapes=${SHAPES:-0 100}
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
    local args=("${compiler_flags[@]}" -fthinlto-distributor="$distributor"
        -Xthinlto-distributor=--jobs="$jobs")
    for a in "$@"; do args+=("-Xthinlto-distributor=$a"); done
    clang_link "$output" "${args[@]}"
}

# measured NAME: a distributor script running dtlto-reapi under GNU time, which appends "NAME
# peak-RSS-KiB user-s system-s" to $out/rusage.tsv.
measured() {
    local script=$out/measured-$1.sh
    printf '#!/bin/sh\nexec /usr/bin/time -f "%s %%M %%U %%S" -a -o "%s" "%s" "$@"\n' \
        "$1" "$out/rusage.tsv" "$distributor" >"$script"
    chmod +x "$script"
    echo "$script"
}

say "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) on $(nproc) cores"
mkdir -p "$(dirname "$results")"
: >"$results"
for shape in $shapes; do
for modules in $sizes; do
    out=$root/bench/out/scaling/$modules-imports-$shape
    project=$out/project
    export IMPORTS=$shape
    generate_project
    # The digest cache lives in bench/out, not the user's.
    export XDG_CACHE_HOME=$out/xdg-cache
    : >"$out/rusage.tsv"
    : >"$out/times.tsv"
    # Fill the three caches: the floor's objects, the server's action cache, lld's cache.
    export FLOOR_STORE=$out/floor-store
    FLOOR_RECORD=1 timed fill-floor "$project" distributed fill-floor "$root/bench/floor_distributor.py"
    start_server
    # The server gets the compiler first (a one-module link), so the cold link measures the jobs.
    mkdir -p "$out/seed" && printf 'int main(void) { return 0; }\n' >"$out/seed/seed.c"
    "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin -c "$out/seed/seed.c" -o "$out/seed/seed.o"
    echo seed.o >"$out/seed/inputs.rsp"
    timed seed "$out/seed" distributed seed "$distributor" --remote="$server_url" --strategy=remote
    timed fill-server "$project" distributed fill-server "$(measured fill-server)" \
        --remote="$server_url" --strategy=remote
    timed fill-lld "$project" clang_link fill-lld "-Wl,--thinlto-jobs=$jobs" "-Wl,--thinlto-cache-dir=$out/lld-cache"
    : >"$out/times.tsv"
    for round in $(seq "$runs"); do
        timed floor "$project" distributed floor "$root/bench/floor_distributor.py"
        timed remote-cached "$project" distributed remote-cached "$(measured remote-cached)" \
            --remote="$server_url" --strategy=remote --stats-json="$out/remote-cached.stats.json"
        fresh=$out/fresh-$round
        mkdir -p "$fresh" && cp "$project"/*.o "$project/inputs.rsp" "$fresh/"
        timed fresh-dir "$fresh" distributed fresh-dir "$(measured fresh-dir)" \
            --remote="$server_url" --strategy=remote --stats-json="$out/fresh-dir.stats.json"
        timed lld-cache-warm "$project" clang_link lld-cache-warm "-Wl,--thinlto-jobs=$jobs" \
            "-Wl,--thinlto-cache-dir=$out/lld-cache"
        say "$modules modules, IMPORTS=$shape: round $round of $runs done"
    done
    stop_server
    expected=$("$project/fill-lld")
    for program in floor remote-cached lld-cache-warm "../fresh-$runs/fresh-dir"; do
        [[ $("$project/$program") == "$expected" ]] || { say "$program printed something else"; exit 1; }
    done
    python3 - "$out" "$modules" "$shape" >>"$results" <<'PY'
import collections, json, sys
out, modules, shape = sys.argv[1:]
for name in ("remote-cached", "fresh-dir"):
    jobs = json.load(open(f"{out}/{name}.stats.json"))["jobs"]
    if any(j["ran"] != "action-cache" for j in jobs):
        sys.exit(f"{name}: not every job was a cache hit")
times = collections.defaultdict(list)
for line in open(f"{out}/times.tsv"):
    name, seconds = line.split()
    times[name].append(float(seconds))
# Per variant: the round with the least CPU, and the largest peak RSS of any round.
cpu, rss = {}, collections.defaultdict(int)
for line in open(f"{out}/rusage.tsv"):
    name, kib, user, system = line.split()
    cpu[name] = min(cpu.get(name, float("inf")), float(user) + float(system))
    rss[name] = max(rss[name], int(kib))
jobs = int(modules) + 1  # and main
own = json.load(open(f"{out}/remote-cached.stats.json"))["wall_ms"] / 1000
for name in ("fill-server", "floor", "remote-cached", "fresh-dir", "lld-cache-warm"):
    seconds = min(times[name]) if times[name] else float("nan")
    per_job = f"{cpu[name] * 1000 / jobs:.3f}" if name in cpu else "-"
    peak = f"{rss[name] / 1024:.1f}" if name in rss else "-"
    mine = f"{own:.3f}" if name == "remote-cached" else "-"
    print(shape, modules, name, f"{seconds:.3f}", mine, per_job, peak, sep="\t")
PY
done
done
say "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

echo "FUNCTIONS=$functions per module, N=$jobs, loopback server with $jobs workers, best of $runs"
python3 - "$results" <<'PY'
import collections, sys
rows = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    shape, modules, name, seconds, own, per_job, peak = line.split()
    rows[(int(shape), int(modules))][name] = (float(seconds), own, per_job, peak)
print(f"{'imports':>7}{'modules':>8}{'floor s':>9}{'cached s':>10}{'/ floor':>9}{'fresh-dir s':>13}{'/ floor':>9}"
      f"{'lld warm s':>12}{'cold ms/job':>13}{'cached ms/job':>15}{'cold MiB':>10}{'cached MiB':>12}")
for (shape, modules), r in sorted(rows.items()):
    floor = r["floor"][0]
    print(f"{shape:>7}{modules:>8}{floor:>9.2f}{r['remote-cached'][0]:>10.2f}{r['remote-cached'][0] / floor:>9.2f}"
          f"{r['fresh-dir'][0]:>13.2f}{r['fresh-dir'][0] / floor:>9.2f}{r['lld-cache-warm'][0]:>12.2f}"
          f"{r['fill-server'][2]:>13}{r['remote-cached'][2]:>15}{r['fill-server'][3]:>10}{r['remote-cached'][3]:>12}")
PY
