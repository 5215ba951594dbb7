#!/usr/bin/env bash
# Memory benchmark: peak RSS of dtlto-reapi for a generated link of MODULES (5000) small modules in
# remote mode against `dtlto-reapi serve` on loopback, and in local mode for comparison.
# Target: under 150 MiB in remote mode. Outputs go to bench/out/memory/ (gitignored).
#
# Environment: MODULES (5000), FUNCTIONS per module (1), JOBS (nproc).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
source "$root/bench/project.sh"
modules=${MODULES:-5000}
functions=${FUNCTIONS:-1}
jobs=${JOBS:-$(nproc)}
out=$root/bench/out/memory
project=$out/project
[[ -x /usr/bin/time ]] || { say "needs GNU time (Debian: apt-get install time)"; exit 1; }

generate_project
cd "$project"

# lld runs this wrapper as the distributor; GNU time records dtlto-reapi's peak RSS in KiB.
cat >"$out/measured-distributor" <<SH
#!/bin/sh
exec /usr/bin/time -f %M -o "\$RSS_FILE" "$distributor" "\$@"
SH
chmod +x "$out/measured-distributor"

trap stop_server EXIT
start_server
url=$server_url

measure() { # name distributor-args...
    local name=$1
    shift
    local args=("${compiler_flags[@]}" -fthinlto-distributor="$out/measured-distributor")
    for a in "$@"; do args+=("-Xthinlto-distributor=$a"); done
    local start=$EPOCHREALTIME
    RSS_FILE=$out/$name.rss "$CLANG" --target=x86_64-linux-gnu -O1 -flto=thin "-fuse-ld=$LLD" @inputs.rsp \
        -o "$name" "${args[@]}" >"$out/$name.log" 2>&1 || { cat "$out/$name.log" >&2; exit 1; }
    local end=$EPOCHREALTIME
    [[ ! -x ./local || $(./"$name") == "$(./local)" ]] || { say "$name printed something else than local"; exit 1; }
    python3 -c 'import sys; kib = int(open(sys.argv[2]).read().split()[-1]); print(f"{sys.argv[1]:<16}{kib / 1024:8.1f} MiB peak RSS{float(sys.argv[3]):8.1f} s link")' \
        "$name" "$out/$name.rss" "$(python3 -c "print($end - $start)")"
}

echo "$modules modules, N=$jobs"
measure local --jobs="$jobs"
measure remote-cold --remote="$url" --strategy=remote
measure remote-cached --remote="$url" --strategy=remote
