#!/usr/bin/env bash
# Racing against local mode and remote-only, in one run, in four scenarios:
#   slow      a busy cluster: `serve --workers 1 --fault-slow Execute=$SLOW_MS`
#   distant   a far cluster: `serve --workers $JOBS --throttle-latency-ms $LATENCY_MS
#             --throttle-bandwidth $BANDWIDTH`
#   relink    an edit of one module relinked with lld's --thinlto-cache-dir warm, so that only the
#             affected jobs reach the distributor; the cluster near (loopback, $JOBS workers) and
#             already holding the rest of the project
#   imports   the same edit-and-relink in a heavy-import project (bench/gen_project.py with
#             IMPORTS=$IMPORTS: each module calls small functions of $IMPORTS others, which ThinLTO
#             imports), so that every job importing from the edited module (about $IMPORTS) reaches
#             the distributor again
#   held      `relink` against a cluster that holds every Execute for $HELD_MS ms, so that its run
#             of the action never overlaps the local compile: the control for `relink`, where the
#             cluster's compile runs on this machine's other core at the same time as the local
#             one and slows it (they share caches and memory, which a separate cluster does not)
# and three variants in each: local (no cluster), remote (--strategy=remote) and racing
# (--strategy=racing), interleaved round by round so that a change in machine load hits each alike,
# and in each of the six orders in turn, so that each follows each about as often (in `held`, the
# link after a remote-only one, which leaves the link's core idle for 3 s, was up to 8% slower).
# Each scenario's server is started once and first given the compiler (a one-module link), so the
# links measure compiles, not the compiler's one-time upload; in `slow` and `distant` each link adds
# a backend flag of its own (-DBENCH_LINK=n, which changes nothing in the objects) so that its
# actions are new to the cluster, and in `relink` and `imports` each link edits the module anew.
# The cluster is another machine, so the machine's cores are split: the link (clang, lld, the
# distributor and its local compiles) runs on the first half (`taskset`), the server and its actions
# on the other half, in a session of its own (`setsid`, so that where the kernel shares CPU time by
# session, sched_autogroup, it does not share the link's). On one machine whose cores both sides
# shared, every action the cluster ran would take its CPU from the local compiles, which no separate
# cluster does (measured: local compiles 40-60% slower during a race, as the server's actions cost
# more than the local compiles they race). --jobs and the server's workers are each half the cores.
# Prints, per scenario, the best wall time of each variant, its ratio to the faster of local and
# remote (and the same ratio of medians over the rounds, with a 95% bootstrap interval), where
# racing's jobs ended (won locally / won remotely / cache hits), the distributor's own CPU (`cpu_ms`
# of --stats-json: its compiles' not included), and every round's time; then, from each link's
# --trace, the medians over rounds of where the distributor's time went: when its first
# local compile started, how long local compiles ran, how long storing a local winner's result
# took, and when its last job ended. Fails unless every program prints what the local one prints.
#
# Environment: MODULES (60), FUNCTIONS per module (16), JOBS (half the cores), RUNS (3), SLOW_MS (1500),
# LATENCY_MS (50), BANDWIDTH (20Mbit), HELD_MS (3000), IMPORT_MODULES (300) and IMPORTS (100) of the
# `imports` project (1 function per module), SCENARIOS ("slow distant relink imports held"), DISTRIBUTOR (the
# dtlto-reapi binary to measure; default: this checkout's release build), KEEP_PROJECT=1 (reuse
# the projects of an earlier run with the same sizes instead of generating and compiling them).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
source "$root/bench/project.sh"
distributor=${DISTRIBUTOR:-$distributor}
modules=${MODULES:-60}
functions=${FUNCTIONS:-16}
split_cores
jobs=${JOBS:-$half}
runs=${RUNS:-3}
slow_ms=${SLOW_MS:-1500}
latency=${LATENCY_MS:-50}
bandwidth=${BANDWIDTH:-20Mbit}
held_ms=${HELD_MS:-3000}
import_modules=${IMPORT_MODULES:-300}
imports=${IMPORTS:-100}
scenarios=${SCENARIOS:-slow distant relink imports held}
out=$root/bench/out/racing
project=$out/project
main_project=$project

if [[ ${KEEP_PROJECT:-} == 1 && -d $project && -d $out/imports ]]; then
    say "reusing the projects in $out (KEEP_PROJECT=1)"
else
    generate_project
    # The heavy-import project, beside the other (generate_project starts by removing $out).
    (
        export IMPORTS=$imports
        modules=$import_modules functions=1 project=$out/imports out=$out/imports.tmp
        generate_project
    )
fi
trap stop_server EXIT
serve_launch=(setsid taskset -c "$serve_cpus")
: >"$out/times.tsv"
rm -rf "$out/traces" && mkdir -p "$out/traces"
link_count=0

# link SCENARIO VARIANT LABEL [flags...]: one link of the project in VARIANT (local, remote or
# racing), timed and recorded as LABEL, its stats kept.
link() {
    local scenario=$1 variant=$2 label=$3
    shift 3
    link_count=$((link_count + 1))
    local name=$scenario-$variant stats=$out/$scenario-$variant-$link_count.stats.json
    local args=("${compiler_flags[@]}" -fthinlto-distributor="$distributor"
        -Xthinlto-distributor=--jobs="$jobs" -Xthinlto-distributor=--stats-json="$stats"
        -Xthinlto-distributor=--trace="$out/traces/$scenario-$label-$link_count.json")
    case $variant in
        local) ;;
        *) args+=(-Xthinlto-distributor=--remote="$server_url" -Xthinlto-distributor=--strategy="$variant") ;;
    esac
    # The previous link's writes (the server's files too) are flushed before this one is timed.
    sync
    local start=$EPOCHREALTIME
    taskset -c "$link_cpus" "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin "-fuse-ld=$LLD" @inputs.rsp -o "$name" \
        "${args[@]}" "$@" >"$out/$name.log" 2>&1 || { cat "$out/$name.log" >&2; exit 1; }
    local end=$EPOCHREALTIME
    python3 - "$stats" "$scenario" "$label" "$(python3 -c "print($end - $start)")" >>"$out/times.tsv" <<'PY'
import json, os, sys
path, scenario, variant, wall = sys.argv[1:]
stats = json.load(open(path)) if os.path.exists(path) else {}
jobs = stats.get("jobs", [])
won = lambda side: sum(1 for j in jobs if (j.get("race") or {}).get("winner") == side)
hits = sum(1 for j in jobs if j["ran"] == "action-cache")
print(scenario, variant, wall, len(jobs), won("local"), won("remote"), hits, stats.get("cpu_ms", 0), sep="\t")
PY
    if [[ $variant == local ]]; then
        cp "$name" "$scenario.expected"
    elif [[ -e $scenario.expected && $("./$name") != "$("./$scenario.expected")" ]]; then
        say "$name prints something else than local mode's program"
        exit 1
    fi
}

# prime: the server gets the compiler, with a one-module program linked through it — remote-only:
# racing (the default) lets the local side win and leaves the compiler's upload unfinished, which the
# first remote-only link then pays for (74 s at `distant`'s 20 Mbit).
prime() {
    mkdir -p "$out/prime" && cp "$main_project/m0000.c" "$out/prime/one.c"
    sed -i 's/^long entry1(long);$//; s/\^ entry1(x + 1)//' "$out/prime/one.c"
    printf 'long entry0(long);\nint main(void) { return (int)entry0(1) & 1; }\n' >"$out/prime/main.c"
    (cd "$out/prime" && "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin "-fuse-ld=$LLD" one.c main.c -o one \
        "${compiler_flags[@]}" -fthinlto-distributor="$distributor" -Xthinlto-distributor=--remote="$server_url" \
        -Xthinlto-distributor=--strategy=remote >"$out/prime.log" 2>&1) || { cat "$out/prime.log" >&2; exit 1; }
}

edits=0
# edits_each_link SCENARIO: whether each of its links follows an edit of one module (lld's cache warm).
edits_each_link() { [[ $1 == relink || $1 == imports || $1 == held ]]; }
# Each run's edits are new to lld's cache and the cluster's, even with KEEP_PROJECT=1.
run_id=${EPOCHREALTIME/[.,]/}
# edit SCENARIO: a new version of one module in the middle of the chain (a new variable, which
# changes no program, with a value no earlier link saw), recompiled; its own job runs again, and so
# does every job that imports from it (ThinLTO keys a backend job by the modules it imports from): none in `relink`, about $IMPORTS
# in `imports`.
edit() {
    edits=$((edits + 1))
    local edited
    if [[ $1 == imports ]]; then edited=$(printf 'm%04d' $((import_modules / 2))); else edited=$(printf 'm%04d' $((modules / 2))); fi
    sed -i '/ bench_edit/d' "$edited.c"
    echo "const char bench_edit[] = \"$run_id-$edits\";" >>"$edited.c"
    "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin -c "$edited.c" -o "$edited.o"
}

say "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) on $cores cores: the link on $link_cpus, the server on $serve_cpus"
for scenario in $scenarios; do
    if [[ $scenario == imports ]]; then cd "$out/imports"; else cd "$main_project"; fi
    case $scenario in
        # start_server gives the server $jobs workers: one here.
        slow) local_jobs=$jobs; jobs=1; start_server --fault-slow "Execute=$slow_ms"; jobs=$local_jobs ;;
        distant) start_server --throttle-latency-ms "$latency" --throttle-bandwidth "$bandwidth" ;;
        relink | imports) start_server ;;
        held) start_server --fault-slow "Execute=$held_ms" ;;
        *) say "unknown scenario $scenario"; exit 1 ;;
    esac
    prime
    if edits_each_link "$scenario"; then
        # lld's cache and the cluster's both warm with the whole project.
        cache=$out/$scenario-lld-cache && rm -rf "$cache"
        link "$scenario" remote warmup -Wl,--thinlto-cache-dir="$cache"
    fi
    orders=("local remote racing" "racing remote local" "remote racing local" "local racing remote"
        "racing local remote" "remote local racing")
    for round in $(seq "$runs"); do
        # shellcheck disable=SC2086 # one order, split into its variants
        for variant in ${orders[round % 6]}; do
            if edits_each_link "$scenario"; then
                edit "$scenario"
                link "$scenario" "$variant" "$variant" -Wl,--thinlto-cache-dir="$cache"
            else
                link "$scenario" "$variant" "$variant" "-Wl,--thinlto-remote-compiler-arg=-DBENCH_LINK=$link_count"
            fi
        done
        say "$scenario: round $round of $runs done"
    done
    stop_server
done
say "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

echo "$modules modules x $functions functions, --jobs=$jobs, best of $runs; slow: 1 worker, Execute held ${slow_ms} ms;" \
    "distant: $jobs workers, ${latency} ms per call, $bandwidth; relink: one module edited, lld cache warm, $jobs workers;" \
    "imports: $import_modules modules x 1 function importing from $imports each, one module edited;" \
    "held: relink with every Execute held ${held_ms} ms"
python3 - "$out/times.tsv" <<'PY'
import collections, random, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    scenario, variant, wall, jobs, won_local, won_remote, hits, cpu_ms = line.split("\t")
    if variant != "warmup":
        rows[(scenario, variant)].append((float(wall), int(jobs), int(won_local), int(won_remote), int(hits), int(cpu_ms)))


def median_ratio(walls, variant, picked):
    """The median of `variant`'s links over the rounds `picked`, against the faster median of local
    mode and remote-only over the same rounds."""
    median = lambda v: statistics.median(walls[v][i] for i in picked)
    return median(variant) / min(median(v) for v in ("local", "remote") if v in walls)


print(f"{'scenario':<9}{'variant':<8}{'link s':>8}{'jobs':>6}{'/ faster of local, remote':>27}{'median, same':>14}"
      f"{'95% interval':>15}{'races won local/remote':>24}{'cache hits':>12}{'own CPU ms':>12}")
for scenario in dict.fromkeys(s for s, _ in rows):
    variants = [v for v in ("local", "remote", "racing") if (scenario, v) in rows]
    best = {v: min(rows[(scenario, v)]) for v in variants}
    faster = min(best[v][0] for v in ("local", "remote") if v in best)
    # Medians too: the best of a few one-job links is often one lucky round. The interval is a
    # bootstrap over rounds (each round's links resampled together, as they ran together), so a
    # ratio of medians can be told apart from the rounds' noise.
    walls = {v: [r[0] for r in rows[(scenario, v)]] for v in variants}
    rounds = min(len(w) for w in walls.values())
    every = range(rounds)
    sampler = random.Random(1)
    samples = [[sampler.randrange(rounds) for _ in every] for _ in range(2000)]
    for variant, (wall, jobs, won_local, won_remote, hits, cpu_ms) in best.items():
        races = f"{won_local}/{won_remote}" if variant == "racing" else "-"
        spread = sorted(median_ratio(walls, variant, picked) for picked in samples)
        interval = f"{spread[50]:.3f}-{spread[1949]:.3f}" if rounds > 1 else "-"
        print(f"{scenario:<9}{variant:<8}{wall:>8.2f}{jobs:>6}{wall / faster:>27.3f}"
              f"{median_ratio(walls, variant, every):>14.3f}{interval:>15}{races:>24}{hits:>12}{cpu_ms:>12}")
print("rounds (link s, in order):")
for (scenario, variant), runs in rows.items():
    print(f"  {scenario:<9}{variant:<8}" + " ".join(f"{r[0]:.2f}" for r in runs))
PY
python3 - "$out/traces" <<'PY'
import collections, glob, json, os, statistics, sys
# Per link: when the first local compile started, the median local compile, the median store of a
# local winner (the uploads of a job after its race ended), and when the last job ended; in ms from
# the start of the distributor's trace.
links = collections.defaultdict(list)
for path in glob.glob(os.path.join(sys.argv[1], "*.json")):
    scenario, variant, _ = os.path.basename(path)[:-5].rsplit("-", 2)
    if variant == "warmup":
        continue
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X" and e.get("pid") != 2]
    end = lambda e: e["ts"] + e.get("dur", 0)
    compiles = [e for e in events if e["name"] == "local compile"]
    stores = []
    for race in (e for e in events if e["name"] == "race"):
        job = next((e for e in events if e["tid"] == race["tid"] and "index" in e.get("args", {})
                    and e["ts"] <= race["ts"] and end(race) <= end(e)), None)
        if job is None:
            continue
        stores.append(sum(e.get("dur", 0) for e in events if e["tid"] == race["tid"] and e["name"] == "upload"
                          and end(race) <= e["ts"] <= end(job)))
    stored = [s for s in stores if s]
    links[(scenario, variant)].append((
        min((e["ts"] for e in compiles), default=None),
        statistics.median(e.get("dur", 0) for e in compiles) if compiles else None,
        statistics.median(stored) if stored else None,
        max((end(e) for e in events if "index" in e.get("args", {})), default=None),
    ))
median = lambda xs: f"{statistics.median(xs) / 1000:.2f}" if xs else "-"
print("from --trace, medians over rounds (ms from the distributor's start):")
print(f"  {'scenario':<9}{'variant':<8}{'first compile':>15}{'compile':>10}{'store':>8}{'last job ends':>15}")
order = {"local": 0, "remote": 1, "racing": 2}
for (scenario, variant), rows in sorted(links.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 3))):
    columns = [median([r[i] for r in rows if r[i] is not None]) for i in range(4)]
    print(f"  {scenario:<9}{variant:<8}{columns[0]:>15}{columns[1]:>10}{columns[2]:>8}{columns[3]:>15}")
PY
