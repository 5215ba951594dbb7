#!/usr/bin/env bash
# Finds a DTLTO-capable clang and lld (version 21 or newer) and prints where they are, one
# `NAME=PATH` line each (CLANG, LLD, AR, BIN), for tests, benchmarks and the README's sample link.
#
# A clang and ld.lld >= 21 on PATH are preferred. Otherwise clang/lld 22 come from PyPI's
# ziglang package, installed once into a virtual environment outside the repository by
# scripts/ziglang.sh, with one-line wrappers (`clang`, `ld.lld`, `llvm-ar`) that make the zig binary
# look like ordinary tools.
#
# Environment: DTLTO_REAPI_TOOLCHAIN_DIR overrides the cache directory
# (default: ${XDG_CACHE_HOME:-~/.cache}/dtlto-reapi/toolchain).
set -euo pipefail

dir="${DTLTO_REAPI_TOOLCHAIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dtlto-reapi/toolchain}"
bin="$dir/bin"

major_version() { # prints the major version of an LLVM tool, or 0
    "$1" --version 2>/dev/null | sed -n 's/^\(.* \)\{0,1\}\(clang version\|LLD\) \([0-9][0-9]*\)\..*/\3/p' | head -n1 | grep . || echo 0
}

write_wrapper() { # name, command line that takes "$@"
    local tmp
    tmp=$(mktemp "$bin/.$1.XXXXXX") # unique: concurrent runs must not share a temporary name
    printf '#!/bin/sh\nexec %s "$@"\n' "$2" >"$tmp"
    chmod 755 "$tmp"
    mv -f "$tmp" "$bin/$1"
}

mkdir -p "$bin"
sys_clang=$(command -v clang || true)
sys_lld=$(command -v ld.lld || true)
if [[ -n "$sys_clang" && -n "$sys_lld" && $(major_version "$sys_clang") -ge 21 && $(major_version "$sys_lld") -ge 21 ]]; then
    write_wrapper clang "'$sys_clang'"
    write_wrapper ld.lld "'$sys_lld'"
    sys_ar=$(command -v llvm-ar || command -v ar)
    write_wrapper llvm-ar "'$sys_ar'"
else
    zig=$("$(dirname "${BASH_SOURCE[0]}")/ziglang.sh" | sed -n 's/^ZIG=//p')
    zigdir=$(dirname "$zig")
    write_wrapper clang "'$zigdir/zig' clang -resource-dir '$zigdir/lib'"
    write_wrapper ld.lld "'$zigdir/zig' ld.lld"
    write_wrapper llvm-ar "'$zigdir/zig' ar"
fi

for tool in clang ld.lld; do
    v=$(major_version "$bin/$tool")
    if [[ "$v" -lt 21 ]]; then
        echo "toolchain.sh: $bin/$tool reports LLVM major version $v; DTLTO needs 21 or newer" >&2
        exit 1
    fi
done
echo "BIN=$bin"
echo "CLANG=$bin/clang"
echo "LLD=$bin/ld.lld"
echo "AR=$bin/llvm-ar"
