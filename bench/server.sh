# Sourced (not run) by the remote benchmarks, after scripts/env.sh: `start_server` starts a fresh
# `dtlto-reapi serve --workers $jobs` on loopback (stopping the previous one) and sets
# `server_url`; `stop_server` stops it, and runs at exit. Its output goes to $out/serve.{out,err}.

server_pid=
server_url=
start_server() {
    stop_server
    "$distributor" serve --workers "$jobs" >"$out/serve.out" 2>"$out/serve.err" &
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
trap stop_server EXIT
