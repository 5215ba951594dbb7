# Sourced (not run) by the scripts that link with dtlto-reapi: builds the release binary when it is
# out of date and sets `root`, `target`, `distributor` and the toolchain's `CLANG`, `LLD` and `AR`
# (from scripts/toolchain.sh), plus `say`, which prefixes messages with the sourcing script's name.

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
say() { echo "$(basename "$0"): $*" >&2; }

say "building dtlto-reapi (release)"
cargo build --release --quiet --manifest-path "$root/Cargo.toml"
distributor=$target/release/dtlto-reapi

toolchain=$("$root/scripts/toolchain.sh")
CLANG=$(sed -n 's/^CLANG=//p' <<<"$toolchain")
LLD=$(sed -n 's/^LLD=//p' <<<"$toolchain")
AR=$(sed -n 's/^AR=//p' <<<"$toolchain")
