# Sourced (not run) by the scripts that link with dtlto-reapi: builds the release binary when it is
# out of date and sets `root`, `target`, `distributor` and the toolchain's `CLANG`, `LLD` and `AR`
# (from scripts/toolchain.sh), `compiler_flags` (the link flags naming the real compiler executable
# for backend compiles, so that it can travel with remote actions), plus `say`, which prefixes
# messages with the sourcing script's name.

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
COMPILER=$(sed -n 's/^COMPILER=//p' <<<"$toolchain")
COMPILER_PREPEND=$(sed -n 's/^COMPILER_PREPEND=//p' <<<"$toolchain")
compiler_flags=("-Wl,--thinlto-remote-compiler=$COMPILER")
if [[ -n "$COMPILER_PREPEND" ]]; then
    compiler_flags+=("-Wl,--thinlto-remote-compiler-prepend-arg=$COMPILER_PREPEND")
fi
