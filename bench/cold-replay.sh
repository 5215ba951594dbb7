#!/usr/bin/env bash
# A cold remote link's distributor CPU per job, without the rest of the link: captures the job file
# and index shards of one link of bench/imports.sh's heavy-import project (the thin link only: the
# capturing distributor fails the link once it has copied them), then replays that job file with
# every build in DISTRIBUTORS, in interleaved rounds, each against a fresh `dtlto-reapi serve` on
# loopback that already holds the compiler (--strategy=remote: every job executed). It prints each
# build's `cpu_ms` / jobs (from --stats-json) per round and their median, and fails unless every
# replay wrote the same objects as the first. Every replay starts from the same digest cache (a copy
# of OUT's as it was before the first), so that none finds what an earlier replay remembered (such
# as the shards' rewrites, which a real cold link must make).
#
# Environment: OUT (bench/out/imports: the project of bench/imports.sh, generated there first if
# missing, with MODULES, IMPORTS and FUNCTIONS as in that script), DISTRIBUTORS (space-separated
# paths of dtlto-reapi binaries, each named dtlto-reapi; default: this checkout's release build),
# RUNS (3), JOBS (nproc: the distributor's --jobs and the server's workers).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
source "$root/bench/project.sh"
read -r -a builds <<<"${DISTRIBUTORS:-$distributor}"
modules=${MODULES:-1000}
export IMPORTS=${IMPORTS:-100}
functions=${FUNCTIONS:-1}
jobs=${JOBS:-$(nproc)}
runs=${RUNS:-3}
out=${OUT:-$root/bench/out/imports}
project=$out/project
replay=$out/replay
objects=
# The replayed objects and shards must not stay among the project's objects.
clean_up() {
    stop_server
    # shellcheck disable=SC2086 # $objects is a list of plain file names
    [[ -z $objects ]] || (cd "$project" && rm -f $objects)
    [[ ! -d $replay/shards ]] || (cd "$replay/shards" && find . -type f -exec rm -f "$project"/{} \;)
}
trap clean_up EXIT

for build in "${builds[@]}"; do
    [[ $(basename "$build") == dtlto-reapi ]] || { say "$build: a build must be named dtlto-reapi"; exit 1; }
done
[[ -d $project ]] || generate_project
cd "$project"

# Capture: a distributor that copies the job file (its last argument) and the shards it names.
rm -rf "$replay" && mkdir -p "$replay/capture" "$out/xdg-cache"
cp -a "$out/xdg-cache" "$replay/xdg-cache-before"
cat >"$replay/capture/dtlto-reapi" <<'EOF'
#!/usr/bin/env python3
import json, shutil, sys
job_file, into = sys.argv[-1], sys.argv[-2]
shutil.copy(job_file, f"{into}/job.json")
for job in json.load(open(job_file))["jobs"]:
    shutil.copy(job["inputs"][1], f"{into}/shards/")
sys.exit("captured")
EOF
chmod +x "$replay/capture/dtlto-reapi"
mkdir -p "$replay/shards"
"$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin "-fuse-ld=$LLD" @inputs.rsp -o replayed "${compiler_flags[@]}" \
    -fthinlto-distributor="$replay/capture/dtlto-reapi" -Xthinlto-distributor="$replay" >"$replay/capture.log" 2>&1 || true
[[ -f $replay/job.json ]] || { cat "$replay/capture.log" >&2; say "nothing captured"; exit 1; }
objects=$(python3 -c 'import json, sys; print(" ".join(j["outputs"][0] for j in json.load(open(sys.argv[1]))["jobs"]))' "$replay/job.json")

say "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) on $(nproc) cores"
: >"$replay/times.tsv"
for round in $(seq "$runs"); do
    for i in "${!builds[@]}"; do
        distributor=${builds[$i]}
        rm -rf "$replay/xdg-cache" && cp -a "$replay/xdg-cache-before" "$replay/xdg-cache"
        export XDG_CACHE_HOME=$replay/xdg-cache
        seeded_server
        # shellcheck disable=SC2086 # $objects is a list of plain file names
        rm -f $objects
        cp "$replay"/shards/* .
        stats=$replay/$i.stats.json
        "$distributor" --remote="$server_url" --strategy=remote --jobs="$jobs" --stats-json="$stats" "$replay/job.json"
        # shellcheck disable=SC2086
        sum=$(cat $objects | sha256sum | cut -d' ' -f1)
        python3 - "$stats" "$i" "$sum" >>"$replay/times.tsv" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(sys.argv[2], s["cpu_ms"] / len(s["jobs"]), s["wall_ms"] / 1000, sys.argv[3])
PY
    done
    say "round $round of $runs done"
done
clean_up
say "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

echo "cold replay of $(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["jobs"]))' "$replay/job.json") jobs ($modules modules, IMPORTS=$IMPORTS), --jobs=$jobs, loopback server with $jobs workers, $runs rounds"
python3 - "$replay/times.tsv" "${builds[@]}" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
if len({r[3] for r in rows}) != 1:
    sys.exit("the replays wrote different objects")
print(f"{'build':<50}{'CPU ms/job, by round':>28}{'median':>9}{'wall s':>9}")
for i, build in enumerate(sys.argv[2:]):
    mine = [r for r in rows if r[0] == str(i)]
    cpu = [float(r[1]) for r in mine]
    wall = statistics.median(float(r[2]) for r in mine)
    print(f"{build:<50}{' '.join(f'{c:.3f}' for c in cpu):>28}{statistics.median(cpu):>9.3f}{wall:>9.1f}")
PY
