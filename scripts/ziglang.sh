#!/usr/bin/env bash
# Installs PyPI's ziglang package (one static `zig` executable with clang, lld and llvm-ar 22.1.8, and
# zig's `lib/` directory beside it) once into a virtual environment outside the repository, and
# prints where it is: `ZIG=PATH` (the executable) and `ZIG_LIB=PATH` (its lib/ directory).
#
# scripts/toolchain.sh uses it when there is no clang/lld >= 21 on PATH; the Windows tests use it
# always, for `zig lld-link`, `zig dlltool` and zig's MinGW import-library definitions.
#
# Environment: DTLTO_REAPI_TOOLCHAIN_DIR overrides the cache directory
# (default: ${XDG_CACHE_HOME:-~/.cache}/dtlto-reapi/toolchain).
set -euo pipefail

ZIGLANG_VERSION=0.17.1
dir="${DTLTO_REAPI_TOOLCHAIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dtlto-reapi/toolchain}"
venv="$dir/ziglang-$ZIGLANG_VERSION"
if ! compgen -G "$venv/lib/python3*/site-packages/ziglang/zig" >/dev/null; then
    echo "ziglang.sh: installing ziglang==$ZIGLANG_VERSION from PyPI into $venv" >&2
    mkdir -p "$dir"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "ziglang==$ZIGLANG_VERSION" >&2
fi
zigdir=$(dirname "$(compgen -G "$venv/lib/python3*/site-packages/ziglang/zig" | head -n1)")
echo "ZIG=$zigdir/zig"
echo "ZIG_LIB=$zigdir/lib"
