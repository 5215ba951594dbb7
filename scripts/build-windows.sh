#!/usr/bin/env bash
# Builds dtlto-reapi for Windows hosts from Linux: target/x86_64-pc-windows-gnu/release/dtlto-reapi.exe
# (the README's Windows build command). Installs what it needs when missing:
#
# - the Rust target x86_64-pc-windows-gnu (rustup), and Debian's gcc-mingw-w64-x86-64 (the linker),
#   with apt-get as root or through `sudo -n`, else it stops and prints the command;
# - for running the .exe under wine (the Windows tests): bcryptprimitives.dll beside it, a stub built
#   from scripts/windows/bcryptprimitives.c (Debian's wine 8.0 lacks the DLL that Rust >= 1.78
#   programs take random bytes from); and zig.exe (clang and lld-link 22) from PyPI's
#   ziglang==0.17.1 win_amd64 wheel, unpacked once next to scripts/ziglang.sh's Linux zig.
#
# Prints `EXE=PATH` (the distributor) and `ZIG_EXE=PATH` (the Windows zig). Arguments are passed
# on to cargo (e.g. --locked); `--installed` only prints the paths, and fails naming what is missing
# (the tests use it: they need what this script builds, and fail rather than skip without it).
# Environment: DTLTO_REAPI_TOOLCHAIN_DIR as for scripts/ziglang.sh.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export DEBIAN_FRONTEND=noninteractive
TARGET=x86_64-pc-windows-gnu
ZIGLANG_VERSION=0.17.1
out="${CARGO_TARGET_DIR:-$PWD/target}/$TARGET/release"
dir="${DTLTO_REAPI_TOOLCHAIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dtlto-reapi/toolchain}"
zigwin="$dir/ziglang-$ZIGLANG_VERSION-win_amd64"

if [[ "${1:-}" == --installed ]]; then
    for file in "$out/dtlto-reapi.exe" "$out/bcryptprimitives.dll" "$zigwin/ziglang/zig.exe"; do
        if [[ ! -f "$file" ]]; then
            echo "build-windows.sh: $file is missing: run scripts/build-windows.sh" >&2
            exit 1
        fi
    done
    echo "EXE=$out/dtlto-reapi.exe"
    echo "ZIG_EXE=$zigwin/ziglang/zig.exe"
    exit 0
fi

if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$TARGET"; then
    echo "build-windows.sh: rustup target add $TARGET" >&2
    rustup target add "$TARGET" >&2
fi

source scripts/debian-packages.sh
install_debian_packages "the Windows build (mingw's gcc is its linker)" gcc-mingw-w64-x86-64

cargo build --release --target "$TARGET" "$@" >&2

stub="$out/bcryptprimitives.dll"
if [[ ! "$stub" -nt scripts/windows/bcryptprimitives.c ]]; then
    x86_64-w64-mingw32-gcc -shared -O2 -s -o "$stub" scripts/windows/bcryptprimitives.c -ladvapi32
fi

if [[ ! -f "$zigwin/ziglang/zig.exe" ]]; then
    echo "build-windows.sh: installing zig.exe from ziglang==$ZIGLANG_VERSION (win_amd64) into $zigwin" >&2
    mkdir -p "$dir"
    download=$(mktemp -d)
    trap 'rm -rf "$download"' EXIT
    # The pip of scripts/ziglang.sh's virtual environment (a system python3 may have no pip).
    pip="$(dirname "$(scripts/ziglang.sh | sed -n 's/^ZIG=//p')")"
    pip="${pip%/lib/python3*}/bin/pip"
    "$pip" download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --platform win_amd64 --dest "$download" "ziglang==$ZIGLANG_VERSION" >&2
    rm -rf "$zigwin.partial"
    python3 -m zipfile -e "$download"/ziglang-*.whl "$zigwin.partial"
    rm -rf "$zigwin"
    mv "$zigwin.partial" "$zigwin"
fi

echo "EXE=$out/dtlto-reapi.exe"
echo "ZIG_EXE=$zigwin/ziglang/zig.exe"
