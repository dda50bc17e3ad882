#!/usr/bin/env bash
# floodgate proxy's throughput and latency against the same upstream reached
# directly, with wrk over loopback. Not a test: figures for benches/README.md.
#
#   benches/proxy.sh [SECONDS] [CONNECTIONS]     (defaults: 10 s, 16)
#
# Three runs of SECONDS each, wrk with one thread: the upstream directly
# (examples/bench_upstream.rs, a hyper "hello"), through the proxy with a
# limit it never reaches (every request forwarded), and through the proxy
# with a limit spent at once (every request answered 429 by the layer, the
# upstream never asked). Everything runs on this machine: wrk, the proxy and
# the upstream share its cores, so the figures compare, they do not bound.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
connections=${2:-16}
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)" >&2; exit 1; }
cargo build --release -q -p floodgate-cli --bin floodgate --example bench_upstream

pids=()
trap 'for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done' EXIT

# Starts a server, waits for its `listening on URL` line, prints the URL.
start() {
    local out
    out=$(mktemp)
    "$@" >"$out" 2>/dev/null &
    pids+=($!)
    for _ in $(seq 100); do
        if grep -q '^listening on ' "$out"; then
            sed -n 's/^listening on //p' "$out"
            return
        fi
        sleep 0.1
    done
    echo "$1 did not start" >&2
    exit 1
}

upstream=$(start target/release/examples/bench_upstream)
admitting=$(start target/release/floodgate proxy --listen 127.0.0.1:0 --upstream "$upstream" \
    --policy gcra --limit 1000000 --window 1s)
rejecting=$(start target/release/floodgate proxy --listen 127.0.0.1:0 --upstream "$upstream" \
    --policy fixed-window --limit 1 --window 1h)

run() {
    echo "== $1"
    timeout $((seconds + 30)) wrk -t1 -c"$connections" -d"${seconds}s" --latency "$2/" \
        | grep -E 'Latency|50%|90%|99%|Requests/sec|Non-2xx|requests in'
}
run "upstream directly" "$upstream"
run "through floodgate proxy, admitted" "$admitting"
run "through floodgate proxy, rejected (429)" "$rejecting"
