#!/usr/bin/env bash
# What racing adds to a one-job link, without the link around it: captures the job file and index
# shard of one backend job (the middle module of a bench/racing.sh-sized project) and replays that
# job file, in interleaved rounds, in local mode and with --strategy=racing against a `dtlto-reapi
# serve` that holds every Execute for HELD_MS (so that the local side always wins and the cluster's
# copy of the compile never runs beside it: `held` of bench/racing.sh). Each replay adds a flag of
# its own to the job's arguments (-DBENCH_REPLAY=n, which changes no object), so that every racing
# replay misses the action cache and races, as an edit-and-relink does. Cores are split as in
# bench/racing.sh: the distributor and its compile on the first half, the server on the other.
#
# Prints, per variant, medians over the rounds of: the distributor's whole run (exec to exit, ms),
# from its --trace when its first local compile started, how long that compile ran, how long storing
# the local winner's result took, when the job ended, what came after it up to the exit (with what
# came before the trace began), and the distributor's own CPU (`cpu_ms`). A whole link moves by
# ±10–30% from round to round on a small VM, the distributor's own run far less, so this tells
# racing's cost on a relink apart from the machine's noise. Fails unless every replay wrote the
# object local mode wrote.
#
# Environment: MODULES (30), FUNCTIONS per module (16), RUNS (15), HELD_MS (3000), OUT
# (bench/out/racing-replay: the project and the replays; a tmpfs such as /dev/shm keeps the file
# system's costs of writing the objects out of the compiles' times), DISTRIBUTOR (the dtlto-reapi
# binary to measure; default: this checkout's release build).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
source "$root/bench/project.sh"
distributor=${DISTRIBUTOR:-$distributor}
modules=${MODULES:-30}
functions=${FUNCTIONS:-16}
runs=${RUNS:-15}
held_ms=${HELD_MS:-3000}
split_cores
jobs=$half
out=${OUT:-$root/bench/out/racing-replay}
project=$out/project
replay=$out/replay
trap stop_server EXIT

generate_project
cd "$project"

# Capture: a distributor that keeps one job of the job file (its last argument), with its shard.
edited=$(printf 'm%04d' $((modules / 2)))
mkdir -p "$replay"
cat >"$replay/capture" <<EOF
#!/usr/bin/env python3
import json, shutil, sys
job_file = json.load(open(sys.argv[-1]))
job = next(j for j in job_file["jobs"] if j["inputs"][0] == "$edited.o")
job_file["jobs"] = [job]
json.dump(job_file, open("$replay/job.json", "w"))
shutil.copy(job["inputs"][1], "$replay/")
sys.exit("captured")
EOF
chmod +x "$replay/capture"
"$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin "-fuse-ld=$LLD" @inputs.rsp -o captured "${compiler_flags[@]}" \
    -fthinlto-distributor="$replay/capture" >"$replay/capture.log" 2>&1 || true
[[ -f $replay/job.json ]] || { cat "$replay/capture.log" >&2; say "nothing captured"; exit 1; }
cp "$replay"/*.thinlto.bc .
output=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["jobs"][0]["outputs"][0])' "$replay/job.json")

serve_launch=(setsid taskset -c "$serve_cpus")
start_server --fault-slow "Execute=$held_ms"
# The server gets the compiler first (remote-only: a racing link would let its upload go unfinished).
python3 - "$replay/job.json" "$replay/seed.json" <<'PY'
import json, sys
job_file = json.load(open(sys.argv[1]))
job_file["common"]["args"].append("-DBENCH_REPLAY=seed")
json.dump(job_file, open(sys.argv[2], "w"))
PY
"$distributor" --remote="$server_url" --strategy=remote --quiet "$replay/seed.json"

say "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) on $cores cores: the distributor on $link_cpus, the server on $serve_cpus"
: >"$replay/times.tsv"
for round in $(seq "$runs"); do
    for variant in local racing; do
        name=$variant-$round
        python3 - "$replay/job.json" "$replay/$name.json" "$name" <<'PY'
import json, sys
job_file = json.load(open(sys.argv[1]))
job_file["common"]["args"].append(f"-DBENCH_REPLAY={sys.argv[3]}")
json.dump(job_file, open(sys.argv[2], "w"))
PY
        args=(--jobs="$jobs" --quiet --stats-json="$replay/$name.stats.json" --trace="$replay/$name.trace.json")
        [[ $variant == local ]] || args+=(--remote="$server_url" --strategy=racing)
        rm -f "$output"
        start=$EPOCHREALTIME
        taskset -c "$link_cpus" "$distributor" "${args[@]}" "$replay/$name.json"
        end=$EPOCHREALTIME
        if [[ $variant == local ]]; then
            cp "$output" "$replay/expected.o"
        elif ! cmp -s "$output" "$replay/expected.o"; then
            say "$name wrote another object than local mode"
            exit 1
        fi
        python3 - "$replay/$name" "$variant" "$start" "$end" >>"$replay/times.tsv" <<'PY'
import json, sys
name, variant, start, end = sys.argv[1:]
stats = json.load(open(name + ".stats.json"))
events = [e for e in json.load(open(name + ".trace.json"))["traceEvents"]
          if e.get("ph") == "X" and e.get("pid") != 2]
end_of = lambda e: (e["ts"] + e.get("dur", 0)) / 1000
job = next(e for e in events if "index" in e.get("args", {}))
compile_ = next(e for e in events if e["name"] == "local compile")
race = next((e for e in events if e["name"] == "race"), None)
store = sum(e.get("dur", 0) / 1000 for e in events
            if race and e["name"] == "upload" and e["ts"] >= race["ts"] + race.get("dur", 0))
wall = (float(end) - float(start)) * 1000
print(variant, wall, compile_["ts"] / 1000, compile_["dur"] / 1000, store, end_of(job),
      wall - end_of(job), stats["cpu_ms"], sep="\t")
PY
    done
    say "round $round of $runs done"
done
say "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

echo "one job of $edited ($modules modules x $functions functions), Execute held $held_ms ms, $runs rounds; medians, ms"
python3 - "$replay/times.tsv" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    variant, *values = line.rstrip().split("\t")
    rows[variant].append([float(v) for v in values])
columns = ["whole run", "first compile", "compile", "store", "job ends", "before+after", "own CPU"]
print(f"{'variant':<8}" + "".join(f"{c:>15}" for c in columns))
for variant, runs in rows.items():
    print(f"{variant:<8}" + "".join(f"{statistics.median(r[i] for r in runs):>15.2f}" for i in range(len(columns))))
local, racing = (statistics.median(r[0] for r in rows[v]) for v in ("local", "racing"))
print(f"racing's whole run / local mode's: {racing / local:.3f} ({racing - local:+.2f} ms)")
PY
