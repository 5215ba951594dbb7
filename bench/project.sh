# Sourced (not run) by the benchmarks, after scripts/env.sh: `generate_project` writes the C
# project of $modules modules x $functions functions (bench/gen_project.py) to $project, replacing
# $out, compiles it with -flto=thin $jobs at a time, and lists the objects in $project/inputs.rsp.

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
