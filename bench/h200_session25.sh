#!/usr/bin/env bash
# Session 25's H200 calls. Carry .gl (with .gl/extra), BUILD (a release
# build with tests and benches), build-shared (a copy of ../shared/data),
# build-data and build-cli (as for h200_session23.sh).
#
#   bench/h200_session25.sh BUILD [steps...]
#   steps: tests  (test_gpu and test_stream's daemon case, h200_session14.sh;
#                  then test_daemon's e2e case on the H200: the GPU engine's
#                  hit-bomb bound among them)
#          rpc    (4 KiB scans through vkscand: engine-replies yes (the
#                  default since this session) and no, alternated $ROUNDS
#                  times (default 2), each 3 runs of 2 s at 1, 8, 64 and 256
#                  clients inline and 64 by memfd, after a 1 s warm-up at 64)
#          flows  (h200_session14.sh flows: 10,000 streams x 2 writes of
#                  64 KiB, literals-10000, stream.writes of 64)
#          large  (h200_session21.sh large: one 16 GiB stream from a file,
#                  256 MiB writes, window 8, against block mode)
#          big    (64 MiB scans at 64 clients, inline through libvkscan's
#                  default path and as sealed memfds, 3 runs of 3 s each;
#                  vkscand at its defaults but max-frame 80M)
# Every step's output goes to stdout; run it with a timeout and a file.
set -u
B=${1:?usage: h200_session25.sh BUILD [steps...]}
shift
WHAT=${*:-tests}
D=$(dirname "$0")
. "$D/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }

if has tests; then
    bash "$D/h200_session14.sh" "$B" tests
    echo "== test_daemon e2e on the H200"
    ( cd "$B" && VKSCAND=$PWD/daemon/vkscand VKFAULT_SO=$PWD/tests/fault/libvkfault.so \
        READFAULT_SO=$PWD/tests/fault/libreadfault.so CK_RUN_CASE=e2e timeout 300 tests/test_daemon 2>&1 |
        grep -E "Checks|:F:|:E:" )
fi
if has rpc; then
    for round in $(seq "${ROUNDS:-2}"); do
        for m in yes no; do
            rm -rf /tmp/v && mkdir -p /tmp/v
            "$B/daemon/vkscand" --config "" --socket /tmp/v/s.sock --state-dir /tmp/v/st \
                --max-frame 80M --log-level notice --engine-replies $m ${VKSCAND_ARGS:-} \
                >"$OUT/vkscand-$m.log" 2>&1 &
            d=$!
            for _ in $(seq 600); do grep -q "ready on" "$OUT/vkscand-$m.log" && break; sleep 0.1; done
            timeout 30 "$B/bench/rpc_bench" --socket /tmp/v/s.sock --seconds 1 --clients 64 \
                --workloads small --inputs inline --big-mib 1 >/dev/null
            for ic in inline:1 inline:8 inline:64 inline:256 memfd:64; do
                i=${ic%%:*} c=${ic#*:}
                for run in 1 2 3; do
                    timeout 60 "$B/bench/rpc_bench" --socket /tmp/v/s.sock --seconds 2 --clients $c \
                        --workloads small --inputs $i --big-mib 1 | grep -E '^4KiB' |
                        sed "s/^/round $round replies-$m $i c$c run $run: /"
                done
            done
            "$B/client/vkscan" status --socket /tmp/v/s.sock --json | tr ',' '\n' |
                grep -E '"(scans|requests.scan.ok|errors|cpu.spin_hits)"' | tr '\n' ' '
            echo
            kill -TERM $d
            wait $d
            echo "replies-$m vkscand exit $?"
        done
    done
fi
if has flows; then
    MINS=${MINS:-"0 16K"} MODES=${MODES:-b64} FDS=${FDS:-"0 1"} bash "$D/h200_session14.sh" "$B" flows
fi
if has large; then
    CFGS=${CFGS:-2} WRITES=${WRITES:-256M} WINDOWS=${WINDOWS:-8} bash "$D/h200_session21.sh" "$B" large
fi
if has big; then
    rm -rf /tmp/v && mkdir -p /tmp/v
    "$B/daemon/vkscand" --config "" --socket /tmp/v/s.sock --state-dir /tmp/v/st \
        --max-frame 80M --log-level notice ${VKSCAND_ARGS:-} >"$OUT/vkscand-big.log" 2>&1 &
    d=$!
    for _ in $(seq 600); do grep -q "ready on" "$OUT/vkscand-big.log" && break; sleep 0.1; done
    for run in 1 2 3; do
        timeout 90 "$B/bench/rpc_bench" --socket /tmp/v/s.sock --seconds 3 --clients 64 \
            --workloads large --inputs inline,memfd --big-mib 64 | grep -vE '^load' |
            sed "s/^/big run $run: /"
    done
    kill -TERM $d
    wait $d
fi
