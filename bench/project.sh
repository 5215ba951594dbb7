# Sourced (not run) by the benchmarks, after scripts/env.sh: `generate_project` writes the C
# project of $modules modules x $functions functions (bench/gen_project.py) to $project, replacing
# $out, compiles it with -flto=thin $jobs at a time, and lists the objects in $project/inputs.rsp.
# `start_server [serve args...]` (re)starts `dtlto-reapi serve --workers $jobs` and sets
# $server_url (started through the command in the array $serve_launch, if set: see bench/racing.sh);
# `stop_server` stops it (the scripts `trap stop_server EXIT`). `seeded_server` starts one and links
# a one-module program through it (in $project/seed), so that it holds the compiler before anything
# is measured. `copy_objects DIR` copies the project's objects and inputs.rsp into DIR (a fresh
# build directory). `split_cores` sets $cores, $half, $link_cpus and $serve_cpus: the first half of
# the cores for the link, the other half for the server, which stands for another machine (see
# bench/racing.sh).

generate_project() {
    say "generating and compiling $modules modules x $functions functions in $project"
    rm -rf "$out"
    python3 "$root/bench/gen_project.py" "$project" "$modules" "$functions"
    (
        cd "$project"
        printf '%s\n' *.c | xargs -P "$jobs" -n 16 sh -c \
            'for f; do "$0" --target=x86_64-linux-gnu -O2 -flto=thin -c "$f" -o "${f%.c}.o" || exit 1; done' "$CLANG"
        printf '%s\n' *.o >inputs.rsp
    )
}

split_cores() {
    cores=$(nproc)
    if ((cores >= 2)); then
        half=$((cores / 2))
        link_cpus=0-$((half - 1)) serve_cpus=$half-$((cores - 1))
    else
        half=1 link_cpus=0 serve_cpus=0
    fi
}

copy_objects() {
    mkdir -p "$1"
    # find, not a glob: 50,000 objects overflow an exec's argument list.
    find "$project" -maxdepth 1 -name '*.o' -exec cp -t "$1" {} +
    cp "$project/inputs.rsp" "$1/"
}

server_pid=
server_url=
start_server() {
    stop_server
    : >"$out/serve.out"
    ${serve_launch[@]+"${serve_launch[@]}"} "$distributor" serve --workers "$jobs" "$@" >"$out/serve.out" 2>"$out/serve.err" &
    server_pid=$!
    for _ in $(seq 100); do
        server_url=$(sed -n 's/^listening on //p' "$out/serve.out")
        [[ -n $server_url ]] && return
        sleep 0.05
    done
    say "the server did not start"; cat "$out/serve.err" >&2; exit 1
}
stop_server() {
    [[ -z $server_pid ]] || { kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; }
    server_pid=
}

seeded_server() {
    start_server
    local seed=$project/seed
    if [[ ! -f $seed/seed.o ]]; then
        mkdir -p "$seed" && printf 'int main(void) { return 0; }\n' >"$seed/seed.c"
        "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin -c "$seed/seed.c" -o "$seed/seed.o"
    fi
    (cd "$seed" && "$CLANG" --target=x86_64-linux-gnu -O2 -flto=thin "-fuse-ld=$LLD" seed.o -o seed \
        "${compiler_flags[@]}" -fthinlto-distributor="$distributor" -Xthinlto-distributor=--remote="$server_url" -Xthinlto-distributor=--strategy=remote)
}
