#!/usr/bin/env bash
# The next H200 call after session 29 (whose fourth call was refused).
# Carry .gl, build-shared, build-data, BUILD (a release build of HEAD) and
# OLD (a release build of ccb6b45, session 28's last commit, measured in
# session 29's calls 1-3).
#   bench/h200_session29.sh BUILD OLD [steps...]
# Steps:
#   restart  exec to the first CLI scan answered, started at the socket
#            (bench/restart_local.sh), OLD then BUILD, twice, for dict-10 and
#            literals-10000 (issue 10 names a cached 10k-literal catalog),
#            under --engine auto and --engine cpu. Session 29 took the CPU
#            plan's parse and sorts off the first scan: expected dict-10
#            111-138 ms -> under 100 under auto.
#   small    4 KiB inline scans at 1, 8, 64 and 256 clients, 3 runs each
#            (issue 10: p99 at 64 clients under 1 ms; 1.2-1.7 in call 3)
#   tests    test_gpu (the literal tables now take rule strings from
#            cpuplan_rule_string), test_stream's daemon case, test_daemon e2e
set -u
B=${1:?usage: h200_session29.sh BUILD OLD [steps...]}
OLD=${2:?usage: h200_session29.sh BUILD OLD [steps...]}
shift 2
WHAT=${*:-restart small tests}
D=$(dirname "$0")
. "$D/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }

if has restart; then
    for round in 1 2; do
        for rules in build-shared/rebar/dict-10.rules build-data/literals-10000.rules; do
            for eng in auto cpu; do
                for b in "$OLD" "$B"; do
                    echo "== restart round $round $(basename "$rules") --engine $eng: $b"
                    RULES=$rules timeout 60 bash "$D/restart_local.sh" "$b" 5 --engine $eng | tail -n 5
                done
            done
        done
    done
fi
if has small; then
    rm -rf /tmp/v && mkdir -p /tmp/v
    "$B/daemon/vkscand" --config "" --socket /tmp/v/s.sock --state-dir /tmp/v/st \
        --max-frame 80M --log-level notice >"$OUT/vkscand-small.log" 2>&1 &
    d=$!
    for _ in $(seq 600); do grep -q "ready on" "$OUT/vkscand-small.log" && break; sleep 0.1; done
    "$B/bench/rpc_bench" --socket /tmp/v/s.sock --seconds 1 --clients 64 --workloads small \
        --inputs inline --big-mib 1 >/dev/null
    for c in 1 8 64 256; do
        for run in 1 2 3; do
            timeout 60 "$B/bench/rpc_bench" --socket /tmp/v/s.sock --seconds 2 --clients $c \
                --workloads small --inputs inline --big-mib 1 | grep -E '^4KiB' | sed "s/^/c$c run $run: /"
        done
    done
    kill -TERM $d
    wait $d
fi
if has tests; then
    bash "$D/h200_session26.sh" "$B" tests
fi
