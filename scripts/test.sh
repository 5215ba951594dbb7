#!/usr/bin/env bash
# The README's test command: installs what the test suite needs, then runs it
# (`cargo test --release`, with any arguments passed on, e.g. `scripts/test.sh --test local_link`).
#
# - Debian packages: python3-venv (the PyPI tools' virtual environments), gcc and libc6-dev (crt
#   files, libgcc and glibc for the test programs, and gcc as a link driver), cmake, make and ccache
#   (the build-system recipes), wine64 (runs the Windows programs the COFF tests link). Installed
#   with apt-get when missing, as root or through `sudo -n`; otherwise the script stops and prints
#   the command that installs them.
# - From PyPI, once, into ~/.cache/dtlto-reapi: clang/lld 22 (scripts/toolchain.sh, unless a
#   clang/lld >= 21 is on PATH), the ziglang package (scripts/ziglang.sh) and BuildGrid
#   (scripts/buildgrid.sh), the third-party REAPI server of the interop tests.
# - The Windows build of dtlto-reapi and the Windows zig.exe (scripts/build-windows.sh, which
#   installs the Rust target and mingw), for the tests of Windows-hosted links under wine.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export DEBIAN_FRONTEND=noninteractive

source scripts/debian-packages.sh
install_debian_packages "the test suite" python3-venv gcc libc6-dev cmake make ccache wine64

echo "test.sh: clang/lld (scripts/toolchain.sh), ziglang (scripts/ziglang.sh), BuildGrid (scripts/buildgrid.sh)" >&2
scripts/toolchain.sh >/dev/null
scripts/ziglang.sh >/dev/null
scripts/buildgrid.sh >/dev/null
echo "test.sh: the Windows build (scripts/build-windows.sh)" >&2
scripts/build-windows.sh >/dev/null

exec cargo test --release "$@"
