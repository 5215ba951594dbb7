#!/usr/bin/env bash
# Links a real C project that is not in this repository — the brotli compressor, from the C sources
# in PyPI's Brotli 1.1.0 source distribution — with ThinLTO through target/release/dtlto-reapi, in
# local mode and in remote mode against `dtlto-reapi serve` (which cannot see the build directory),
# relinks remotely (every job must be a cache hit), and checks that each program round-trips a file.
#
# The encoder goes into a static archive, so archive members are exercised too. Work happens in
# ${CARGO_TARGET_DIR:-target}/brotli; the source distribution is cached in ~/.cache/dtlto-reapi.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
work=$target/brotli
cache=${XDG_CACHE_HOME:-$HOME/.cache}/dtlto-reapi

sdist=$cache/Brotli-1.1.0.tar.gz
if [[ ! -f $sdist ]]; then
    say "downloading Brotli 1.1.0's source distribution from PyPI"
    mkdir -p "$cache"
    python3 -m pip download --quiet --no-binary :all: --no-deps --dest "$cache" Brotli==1.1.0
fi
rm -rf "$work" && mkdir -p "$work/build" && cd "$work"
tar xzf "$sdist"
src=$work/Brotli-1.1.0/c
cd build
say "compiling $(find "$src" -name '*.c' | wc -l) C files with -flto=thin"
for f in "$src"/common/*.c "$src"/dec/*.c "$src"/enc/*.c "$src"/tools/brotli.c; do
    rel=${f#"$src"/}
    "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin -I"$src/include" -c "$f" -o "${rel//\//_}.o" &
    (( $(jobs -r | wc -l) < $(nproc) )) || wait -n
done
wait
"$AR" rcs libbrotlienc.a enc_*.o

link() { # output, distributor args...
    local output=$1 args=()
    shift
    for a in "$@"; do args+=("-Xthinlto-distributor=$a"); done
    "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin -fuse-ld="$LLD" tools_brotli.c.o common_*.o dec_*.o \
        libbrotlienc.a -lm -o "$output" -fthinlto-distributor="$distributor" \
        "${compiler_flags[@]}" "${args[@]}"
}
round_trip() { # program
    # Quality 5: the default (11) takes half a minute per run on a 12 MB input.
    "./$1" -q 5 -f -o sample.br "$distributor" && "./$1" -d -f -o sample.out sample.br
    cmp -s "$distributor" sample.out || { say "$1 did not round-trip"; exit 1; }
    say "$1 compresses $(stat -c %s "$distributor") bytes to $(stat -c %s sample.br) and back"
}

say "local mode"
link brotli-local
round_trip brotli-local

"$distributor" serve --hide "$work" >"$work/serve.out" 2>"$work/serve.err" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
until url=$(sed -n 's/^listening on //p' "$work/serve.out") && [[ -n $url ]]; do sleep 0.05; done
say "remote mode against $url"
link brotli-remote --remote="$url"
round_trip brotli-remote
say "remote relink (every job must come from the action cache)"
link brotli-relink --remote="$url" --stats-json="$work/relink.json"
python3 - "$work/relink.json" <<'PY'
import json, sys
jobs = json.load(open(sys.argv[1]))["jobs"]
misses = [j["module"] for j in jobs if j["ran"] != "action-cache"]
sys.exit(f"{len(misses)} of {len(jobs)} jobs missed the cache: {misses[:3]}" if misses else 0)
PY
round_trip brotli-relink
say "ok"
