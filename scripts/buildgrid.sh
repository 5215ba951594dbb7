#!/usr/bin/env bash
# Installs BuildGrid (`buildgrid==0.4.4` from PyPI), a third-party REAPI implementation, once into
# a cached virtual environment outside the repository, and prints `BGD=<path of bgd>`. Interop
# tests use its `bgd` client against `dtlto-reapi serve`, and its server to test our client.
#
# Environment: DTLTO_REAPI_BUILDGRID_DIR overrides the venv directory
# (default: ${XDG_CACHE_HOME:-~/.cache}/dtlto-reapi/buildgrid-0.4.4).
# Fails (non-zero exit, pip's error on stderr) when the install fails: callers must not skip.
set -euo pipefail

BUILDGRID_VERSION=0.4.4
venv="${DTLTO_REAPI_BUILDGRID_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dtlto-reapi/buildgrid-$BUILDGRID_VERSION}"
mkdir -p "$(dirname "$venv")"

# Tests run in parallel: one installs while the others wait on the lock.
exec 9>"$venv.lock"
flock 9
if [[ ! -f "$venv/.installed" ]]; then
    echo "buildgrid.sh: installing buildgrid==$BUILDGRID_VERSION from PyPI into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "buildgrid==$BUILDGRID_VERSION" >&2
    "$venv/bin/bgd" --help >/dev/null
    touch "$venv/.installed"
fi
echo "BGD=$venv/bin/bgd"
