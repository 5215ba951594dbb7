#!/usr/bin/env bash
# Links the sample program in examples/sample through dtlto-reapi and runs it: the README's
# "does it work on this machine" command.
#
# It builds dtlto-reapi (release, only if out of date), gets clang/lld from scripts/toolchain.sh,
# compiles examples/sample/*.c with -flto=thin into $CARGO_TARGET_DIR/sample (hash.c goes into the
# static archive libsample.a), links with -fthinlto-distributor=target/release/dtlto-reapi, and runs
# the program (CI compares what it prints with examples/sample/expected-output.txt). Every argument
# is passed on to the distributor as -Xthinlto-distributor=ARG, e.g.
#   scripts/sample-link.sh --jobs=2 --stats-json=/tmp/s.json
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
build=$target/sample

rm -rf "$build"
mkdir -p "$build"
cd "$build"
say "compiling examples/sample/*.c with -flto=thin in $build"
objects=()
for source in "$root"/examples/sample/*.c; do
    object=$(basename "$source" .c).o
    "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin -c "$source" -o "$object"
    [[ $object == hash.o ]] || objects+=("$object")
done
"$AR" rcs libsample.a hash.o

distributor_args=()
for arg in "$@"; do
    distributor_args+=("-Xthinlto-distributor=$arg")
done
say "linking through $distributor"
"$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin -fuse-ld="$LLD" "${objects[@]}" libsample.a -o sample \
    -fthinlto-distributor="$distributor" "${compiler_flags[@]}" "${distributor_args[@]}"

say "running $build/sample"
./sample
