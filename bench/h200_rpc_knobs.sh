#!/usr/bin/env bash
# 4 KiB scans at 1, 64 and 256 clients through vkscand under each of the
# flag sets in $CFGS ("|"-separated; "" is the defaults): 3 runs of 2 s at
# 64 clients, one at 1 and 256, after a 1 s warm-up at 64. Carry .gl and BUILD.
#   bench/h200_rpc_knobs.sh BUILD
set -u
B=${1:?usage: h200_rpc_knobs.sh BUILD}
. "$(dirname "$0")/h200_env.sh"
IFS='|' read -r -a cfgs <<<"${CFGS:-}"
[ ${#cfgs[@]} -gt 0 ] || cfgs=("")
for args in "${cfgs[@]}"; do
    rm -rf /tmp/v && mkdir -p /tmp/v
    # shellcheck disable=SC2086
    "$B/daemon/vkscand" --config "" --socket /tmp/v/s.sock --state-dir /tmp/v/st \
        --log-level notice $args >"$OUT/vkscand-knobs.log" 2>&1 &
    d=$!
    for _ in $(seq 600); do grep -q "ready on" "$OUT/vkscand-knobs.log" && break; sleep 0.1; done
    timeout 30 "$B/bench/rpc_bench" --socket /tmp/v/s.sock --seconds 1 --clients 64 \
        --workloads small --inputs inline --big-mib 1 >/dev/null
    for c in 64 64 64 1 256; do
        timeout 60 "$B/bench/rpc_bench" --socket /tmp/v/s.sock --seconds 2 --clients $c \
            --workloads small --inputs inline --big-mib 1 | grep -E '^4KiB' |
            sed "s/^/[${args:-defaults}] /"
    done
    kill -TERM $d
    wait $d
done
# PERF=1: the last flag set again under perf record (cpu-clock, call graphs)
# while 64 clients run for 4 s; the loop thread's and all threads' top
# symbols. Carry build-perf (perf and its libraries, glibc left out).
if [ -n "${PERF:-}" ]; then
    P="env LD_LIBRARY_PATH=$PWD/build-perf/lib:${LD_LIBRARY_PATH:-} build-perf/perf"
    rm -rf /tmp/v && mkdir -p /tmp/v
    # shellcheck disable=SC2086
    $P record -e cpu-clock -F 4999 -g -o /tmp/v/perf.data -- "$B/daemon/vkscand" --config "" \
        --socket /tmp/v/s.sock --state-dir /tmp/v/st --log-level notice ${cfgs[-1]} \
        >"$OUT/vkscand-perf.log" 2>&1 &
    for _ in $(seq 600); do grep -q "ready on" "$OUT/vkscand-perf.log" && break; sleep 0.1; done
    timeout 30 "$B/bench/rpc_bench" --socket /tmp/v/s.sock --seconds 4 --clients 64 \
        --workloads small --inputs inline --big-mib 1 | grep -E '^4KiB' | sed 's/^/[perf] /'
    pkill -INT -f "$B/daemon/vkscand"
    sleep 3
    $P report -i /tmp/v/perf.data --no-children --sort comm -g none 2>/dev/null | grep '%' | head -n 12
    $P report -i /tmp/v/perf.data --comm vkscand --no-children --sort symbol -g none 2>/dev/null |
        grep '%' | head -n 45
    $P report -i /tmp/v/perf.data --comm vkscand --children --sort symbol -g none 2>/dev/null |
        grep '%' | head -n 45
fi
