#!/usr/bin/env bash
# How busy vkscand's event loop thread is while C clients (default 64) run
# 4 KiB scans for 3 s: loop_busy_ns and loop_cpu_ns over the run's wall
# time, from `vkscan status --json` before and after. Carry .gl and BUILD.
#   bench/h200_loop_share.sh BUILD [vkscand flags...]
set -u
B=${1:?usage: h200_loop_share.sh BUILD [flags]}
shift
. "$(dirname "$0")/h200_env.sh"
rm -rf /tmp/v && mkdir -p /tmp/v
"$B/daemon/vkscand" --config "" --socket /tmp/v/s.sock --state-dir /tmp/v/st --log-level notice \
    "$@" >"$OUT/vkscand-share.log" 2>&1 &
d=$!
for _ in $(seq 600); do grep -q "ready on" "$OUT/vkscand-share.log" && break; sleep 0.1; done
snap() {
    "$B/client/vkscan" --socket /tmp/v/s.sock status --json | tr ',' '\n' |
        grep -E '"(uptime_ns|loop_busy_ns|loop_cpu_ns|scans)"' |
        sed 's/.*"\([a-z_.]*\)":\([0-9]*\).*/\1:\2/' | tr '\n' ' '
}
timeout 30 "$B/bench/rpc_bench" --socket /tmp/v/s.sock --seconds 1 --clients "${C:-64}" \
    --workloads small --inputs inline --big-mib 1 >/dev/null
for run in 1 2 3; do
    s0=$(snap)
    timeout 30 "$B/bench/rpc_bench" --socket /tmp/v/s.sock --seconds 3 --clients "${C:-64}" \
        --workloads small --inputs inline --big-mib 1 | grep -E '^4KiB'
    s1=$(snap)
    echo "$s0 | $s1" | awk -F'|' '{
        n = split($1, a, " "); for (i = 1; i <= n; i++) { split(a[i], kv, ":"); v0[kv[1]] = kv[2] }
        n = split($2, b, " "); for (i = 1; i <= n; i++) { split(b[i], kv, ":"); v1[kv[1]] = kv[2] }
        up = v1["uptime_ns"] - v0["uptime_ns"]
        printf "  loop busy %.0f%%, loop cpu %.0f%% of %.2f s; %d scans\n",
            100 * (v1["loop_busy_ns"] - v0["loop_busy_ns"]) / up,
            100 * (v1["loop_cpu_ns"] - v0["loop_cpu_ns"]) / up, up / 1e9, v1["scans"] - v0["scans"] }'
done
kill -TERM $d
wait $d
