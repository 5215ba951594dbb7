#!/usr/bin/env bash
# How links scale against the floor of the DTLTO path, at each size in SIZES and each import shape in
# SHAPES (bench/gen_project.py's IMPORTS: 0 is a chain, each job ~3 inputs; 100 is ~102 inputs):
#   fill-server     the cold link that fills a fresh `dtlto-reapi serve` (every job executed there);
#                   the floor keeps its objects
#   floor           bench/floor_distributor.py copying ready objects into place (the baseline)
#   remote-cached   dtlto-reapi relinking against the warm server (every job a hit)
#   fresh-dir       the objects copied to a new build directory, linked against the warm server
#   lld-cache-warm  in-process ThinLTO with a warm --thinlto-cache-dir (no distributor at all)
# Best whole-link wall time over RUNS rounds (variants interleaved), dtlto-reapi's own time (from
# --stats-json), its CPU time per job (user + system, and each apart, from GNU time) and peak RSS,
# and ratios to `floor`; rows also go to $OUT/results.tsv, which bench/plot_scaling.py draws.
#
# Environment: SIZES ("300 1000"), SHAPES ("0 100"), FUNCTIONS per module (1), JOBS (nproc),
# RUNS (3), OUT (bench/out/scaling: where projects and results go; a tmpfs keeps the file system's
# own costs out, see bench/README.md), DISTRIBUTOR (the dtlto-reapi binary to measure; default this
# checkout's release build), ALT_DISTRIBUTOR (another build, e.g. with another allocator: its
# all-hit relinks run in the same rounds as `remote-cached-alt` and `fresh-dir-alt`), KEEP_PROJECT=1
# (reuse $OUT/SIZE-imports-SHAPE/project if compiled before), LLD_WARM=0 (skip lld-cache-warm, whose
# fill compiles every job once more). Needs GNU time (/usr/bin/time).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
source "$root/bench/project.sh"
sizes=${SIZES:-300 1000}
shapes=${SHAPES:-0 100}
functions=${FUNCTIONS:-1}
jobs=${JOBS:-$(nproc)}
runs=${RUNS:-3}
distributor=${DISTRIBUTOR:-$distributor}
alt=${ALT_DISTRIBUTOR:-}
lld_warm=${LLD_WARM:-1}
out_root=${OUT:-$root/bench/out/scaling}
results=$out_root/results.tsv
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

# measured NAME [BINARY]: a distributor script running dtlto-reapi (or BINARY) under GNU time,
# which appends "NAME peak-RSS-KiB user-s system-s" to $out/rusage.tsv.
measured() {
    local script=$out/measured-$1.sh
    printf '#!/bin/sh\nexec /usr/bin/time -f "%s %%M %%U %%S" -a -o "%s" "%s" "$@"\n' \
        "$1" "$out/rusage.tsv" "${2:-$distributor}" >"$script"
    chmod +x "$script"
    echo "$script"
}

say "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) on $(nproc) cores"
mkdir -p "$(dirname "$results")"
: >"$results"
for shape in $shapes; do
for modules in $sizes; do
    out=$out_root/$modules-imports-$shape
    project=$out/project
    export IMPORTS=$shape
    if [[ ${KEEP_PROJECT:-} == 1 && -f $project/inputs.rsp ]]; then
        say "reusing $project (KEEP_PROJECT=1)"
        find "$out" -mindepth 1 -maxdepth 1 ! -name project -exec rm -rf {} +
        (cd "$project" && find . -maxdepth 1 -type f ! -name '*.c' ! -name '*.o' ! -name inputs.rsp -delete)
    else
        generate_project
    fi
    # The digest cache lives in $out, not the user's.
    export XDG_CACHE_HOME=$out/xdg-cache
    : >"$out/rusage.tsv"
    : >"$out/times.tsv"
    export FLOOR_STORE=$out/floor-store
    start_server
    # The server gets the compiler first (a one-module link), so the cold link measures the jobs.
    mkdir -p "$out/seed" && printf 'int main(void) { return 0; }\n' >"$out/seed/seed.c"
    "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin -c "$out/seed/seed.c" -o "$out/seed/seed.o"
    echo seed.o >"$out/seed/inputs.rsp"
    timed seed "$out/seed" distributed seed "$distributor" --remote="$server_url" --strategy=remote
    # The cold link fills the server's action cache, and the floor keeps its objects.
    FLOOR_RECORD=1 FLOOR_DELEGATE=$(measured fill-server) timed fill-server "$project" \
        distributed fill-server "$root/bench/floor_distributor.py" --remote="$server_url" --strategy=remote
    say "$modules modules, IMPORTS=$shape: cold link done"
    [[ $lld_warm == 0 ]] ||
        timed fill-lld "$project" clang_link fill-lld "-Wl,--thinlto-jobs=$jobs" "-Wl,--thinlto-cache-dir=$out/lld-cache"
    for round in $(seq "$runs"); do
        timed floor "$project" distributed floor "$root/bench/floor_distributor.py"
        for variant in "" ${alt:+-alt}; do
            binary=$distributor
            [[ -z $variant ]] || binary=$alt
            timed "remote-cached$variant" "$project" distributed "remote-cached$variant" \
                "$(measured "remote-cached$variant" "$binary")" \
                --remote="$server_url" --strategy=remote --stats-json="$out/remote-cached$variant.stats.json"
            fresh=$out/fresh$variant-$round
            copy_objects "$fresh"
            timed "fresh-dir$variant" "$fresh" distributed "fresh-dir$variant" "$(measured "fresh-dir$variant" "$binary")" \
                --remote="$server_url" --strategy=remote --stats-json="$out/fresh-dir$variant.stats.json"
            # The previous round's copy: only the last is kept (it is checked below).
            [[ $round == 1 ]] || rm -rf "$out/fresh$variant-$((round - 1))"
        done
        [[ $lld_warm == 0 ]] ||
            timed lld-cache-warm "$project" clang_link lld-cache-warm "-Wl,--thinlto-jobs=$jobs" \
                "-Wl,--thinlto-cache-dir=$out/lld-cache"
        say "$modules modules, IMPORTS=$shape: round $round of $runs done"
    done
    stop_server
    expected=$("$project/fill-server")
    programs=(floor remote-cached "../fresh-$runs/fresh-dir")
    [[ $lld_warm == 0 ]] || programs+=(fill-lld lld-cache-warm)
    [[ -z $alt ]] || programs+=(remote-cached-alt "../fresh-alt-$runs/fresh-dir-alt")
    for program in "${programs[@]}"; do
        [[ $("$project/$program") == "$expected" ]] || { say "$program printed something else"; exit 1; }
    done
python3 - "$out" "$modules" "$shape" >>"$results" <<'PY'
import collections, json, os, sys
out, modules, shape = sys.argv[1:]
hits = [n for n in ("remote-cached", "fresh-dir", "remote-cached-alt", "fresh-dir-alt")
        if os.path.exists(f"{out}/{n}.stats.json")]
for name in hits:
    jobs = json.load(open(f"{out}/{name}.stats.json"))["jobs"]
    if any(j["ran"] != "action-cache" for j in jobs):
        sys.exit(f"{name}: not every job was a cache hit")
times = collections.defaultdict(list)
for line in open(f"{out}/times.tsv"):
    name, seconds = line.split()
    times[name].append(float(seconds))
# Per variant: the round with the least CPU (its user and system time), and the largest peak RSS of
# any round.
cpu, rss = {}, collections.defaultdict(int)
for line in open(f"{out}/rusage.tsv"):
    name, kib, user, system = line.split()
    user, system = float(user), float(system)
    if user + system < sum(cpu.get(name, (float("inf"), 0))):
        cpu[name] = (user, system)
    rss[name] = max(rss[name], int(kib))
jobs = int(modules) + 1  # and main
for name in ["fill-server", "floor", *hits, "lld-cache-warm"]:
    if name not in times and name not in cpu:
        continue
    seconds = min(times[name]) if times[name] else float("nan")
    ms = lambda s: f"{s * 1000 / jobs:.3f}"
    per_job, user, system = (ms(sum(cpu[name])), ms(cpu[name][0]), ms(cpu[name][1])) if name in cpu else ("-", "-", "-")
    peak = f"{rss[name] / 1024:.1f}" if name in rss else "-"
    own = "-"
    if name in hits:
        own = f"{json.load(open(f'{out}/{name}.stats.json'))['wall_ms'] / 1000:.3f}"
    print(shape, modules, name, f"{seconds:.3f}", own, per_job, peak, user, system, sep="\t")
PY
done
done
say "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

echo "FUNCTIONS=$functions per module, N=$jobs, loopback server with $jobs workers, best of $runs"
echo "(CPU ms/job: user + system, user, system; MiB: the distributor's peak RSS)"
python3 - "$results" <<'PY'
import collections, sys
rows = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    shape, modules, name, seconds, own, per_job, peak, user, system = line.split()
    rows[(int(shape), int(modules))][name] = (float(seconds), own, per_job, peak, user, system)
print(f"{'imports':>7}{'modules':>8}  {'variant':<18}{'link s':>9}{'/ floor':>9}{'own s':>9}"
      f"{'CPU ms/job':>12}{'user':>8}{'system':>8}{'MiB':>8}")
for (shape, modules), r in sorted(rows.items()):
    floor = r["floor"][0]
    for name, (seconds, own, per_job, peak, user, system) in r.items():
        print(f"{shape:>7}{modules:>8}  {name:<18}{seconds:>9.2f}{seconds / floor:>9.2f}{own:>9}"
              f"{per_job:>12}{user:>8}{system:>8}{peak:>8}")
PY
