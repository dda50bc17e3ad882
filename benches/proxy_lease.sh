#!/usr/bin/env bash
# floodgate proxy --backend --lease under wrk: four proxies sharing one key's
# limit through one Redis, and one proxy's throughput on leases against the
# same proxy in memory. Not a test: figures for docs/leases.md.
#
#   benches/proxy_lease.sh [SECONDS] [CONNECTIONS]     (defaults: 5 s, 32)
#
# 1. The bound: four proxies (each its own connection to Redis, `--lease`,
#    `--key global`, so every request is one client's) under four wrk at
#    once, far above `fixed-window:L/1h` (L = $LIMIT, 20,000 by default):
#    the admitted total (every 200 wrk counted) must be at most L and
#    should be near it. One window, so the
#    bound is L itself whatever the run's timing.
# 2. The speed: one proxy with a limit it never reaches (`gcra`, a million a
#    second), in memory and then through Redis with `--lease`, in turn, for
#    three rounds: admitted requests a second and the latency wrk reports.
#
# Everything runs on this machine: wrk, the proxies, Redis and the upstream
# share its cores, so the figures compare, they do not bound. It starts its
# own redis-server on a free loopback port (no persistence) and stops every
# server it started on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-5}
connections=${2:-32}
for tool in wrk redis-server redis-cli; do
    command -v "$tool" >/dev/null || {
        echo "$tool is not installed (apt-get install wrk redis-server redis-tools)" >&2
        exit 1
    }
done
cargo build --release -q -p floodgate-cli --features full --bin floodgate --example bench_upstream

dir=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

# Starts a server in the background of this shell (so its pid is kept for
# the trap), waits for its `listening on URL` line and stores the URL in the
# variable named first.
start() {
    local name=$1 out="$dir/$1.out"
    shift
    "$@" >"$out" 2>"$dir/$name.err" &
    pids+=($!)
    for _ in $(seq 100); do
        if grep -q '^listening on ' "$out"; then
            printf -v "$name" '%s' "$(sed -n 's/^listening on //p' "$out")"
            return
        fi
        sleep 0.1
    done
    echo "$name did not start:" >&2
    cat "$dir/$name.err" >&2
    exit 1
}

port=$((20000 + RANDOM % 40000))
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --loglevel warning >/dev/null &
pids+=($!)
for _ in $(seq 50); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.1
done
backend="redis://127.0.0.1:$port"
start upstream target/release/examples/bench_upstream

# The requests wrk made and the ones answered 200 (wrk counts the others
# as non-2xx).
counts() {
    local total non2xx
    total=$(sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' "$1")
    non2xx=$(sed -n 's/^ *Non-2xx or 3xx responses: *\([0-9]*\)/\1/p' "$1")
    echo "$total $((total - ${non2xx:-0}))"
}

limit=${LIMIT:-20000}
echo "== the bound: four proxies, --lease, one key, fixed-window:$limit/1h, ${seconds}s"
for index in 0 1 2 3; do
    start "shared$index" target/release/floodgate proxy --listen 127.0.0.1:0 \
        --upstream "$upstream" --backend "$backend" --lease --key global \
        --rule "fixed-window:$limit/1h" --metrics-listen 127.0.0.1:0
done
wrks=()
for index in 0 1 2 3; do
    url_name="shared$index"
    timeout $((seconds + 30)) wrk -t1 -c$((connections / 4)) -d"${seconds}s" \
        "${!url_name}/" >"$dir/wrk$index" &
    wrks+=($!)
done
wait "${wrks[@]}"
# Admitted, two ways: the requests wrk saw answered 200, and the ones each
# proxy says it let through (its own 200s and the upstream's failures,
# from its /metrics): wrk misses an admitted request whose answer comes
# after its timeout or its end, so the bound is asserted on the proxies'
# count, the larger. What each proxy's leases did is printed beside it.
admitted=0
passed=0
requests=0
for index in 0 1 2 3; do
    read -r total ok < <(counts "$dir/wrk$index")
    metrics_url=$(sed -n 's/^metrics on //p' "$dir/shared$index.out")
    scrape=$(curl -s "$metrics_url")
    through=$(awk '/^floodgate_proxy_requests_total\{status="200"\}/ { n += $2 }
        /^floodgate_proxy_upstream_errors_total/ { n += $2 } END { print n + 0 }' <<<"$scrape")
    echo "proxy $index: $total requests, $ok answered 200, $through let through;" $(grep -E \
        '^floodgate_redis_(round_trips|errors|leases|leased_units|lease_answers|lease_units_lapsed)_total' \
        <<<"$scrape" | sed 's/^floodgate_redis_//; s/_total{[^}]*}/:/')
    requests=$((requests + total))
    admitted=$((admitted + ok))
    passed=$((passed + through))
done
echo "wrk saw $admitted of $requests requests answered 200; the proxies let $passed through;" \
    "the bound is $limit ($((passed * 100 / limit))% of it)"
if [ "$passed" -gt "$limit" ] || [ "$admitted" -gt "$limit" ]; then
    echo "OVER THE BOUND" >&2
    exit 1
fi

echo
echo "== the speed: a limit never reached, in memory against --lease, ${seconds}s each, wrk -t1 -c$connections"
start memory target/release/floodgate proxy --listen 127.0.0.1:0 --upstream "$upstream" \
    --rule gcra:1000000/1s
start leased target/release/floodgate proxy --listen 127.0.0.1:0 --upstream "$upstream" \
    --backend "$backend" --lease --rule gcra:1000000/1s --metrics-listen 127.0.0.1:0
metrics=$(sed -n 's/^metrics on //p' "$dir/leased.out")
run() {
    timeout $((seconds + 30)) wrk -t1 -c"$connections" -d"${seconds}s" --latency "$2/" >"$dir/run"
    local rate p50 p99
    rate=$(sed -n 's/^Requests\/sec: *\([0-9.]*\)/\1/p' "$dir/run")
    p50=$(sed -n 's/^ *50% *\([0-9.a-z]*\)/\1/p' "$dir/run")
    p99=$(sed -n 's/^ *99% *\([0-9.a-z]*\)/\1/p' "$dir/run")
    read -r total ok < <(counts "$dir/run")
    printf '%-10s %10s req/s  p50 %8s  p99 %8s  (%s of %s admitted)\n' \
        "$1" "$rate" "$p50" "$p99" "$ok" "$total"
    eval "$3=\$rate"
}
for round in 1 2 3; do
    run "in memory" "$memory" in_memory
    run "--lease" "$leased" on_leases
    echo "round $round: --lease at $(awk "BEGIN { printf \"%.2f\", $on_leases / $in_memory }")x in memory"
done
# What the leasing proxy asked of Redis over its three rounds.
curl -s "$metrics" | grep -E '^floodgate_redis_(round_trips|leases|lease_answers)_total' || true
