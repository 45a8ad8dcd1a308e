#!/usr/bin/env bash
# Session 13's H200 call: the GPU tests (with the stream tests through
# vkscand on the real GPU: test_daemon_stream_gpu_batches), every workload
# at compiler version 9, gitleaks-regex grouped as version 8 grouped it
# (--heavy-states 2048) against the new default (512), and stream_bench
# through vkscand with the writes' middles in GPU batches
# (stream-gpu-min-bytes 16K: 64 KiB flow writes have middles just under
# the default 64K) against middles on the CPU (0).
# Carry .gl (with .gl/extra), BUILD, build-shared, build-data.
#
#   bench/h200_session13.sh BUILD [steps...]
#   steps: tests all each regex1g heavy stream (each: every workload in its own
#   process; regex1g: one 1 GiB buffer, no Hyperscan)
set -u
B=${1:?usage: h200_session13.sh BUILD [steps...]}
shift
WHAT=${*:-tests all heavy stream}
. "$(dirname "$0")/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
if has tests; then
    for t in test_gpu test_fault; do
        timeout 120 "$B/tests/$t" >"$OUT/$t.txt" 2>&1
        echo "$t exit $?: $(grep -E 'Checks' "$OUT/$t.txt" | tail -n 1)"
        grep -E ':[EF]:' "$OUT/$t.txt" | head -n 5
    done
    VKSCAND=$B/daemon/vkscand VKSCAN=$B/client/vkscan CK_RUN_CASE=daemon timeout 200 \
        "$B/tests/test_stream" \
        >"$OUT/test_stream.txt" 2>&1
    echo "test_stream (daemon) exit $?: $(grep -E 'Checks' "$OUT/test_stream.txt" | tail -n 1)"
    grep -E ':[EF]:|gpu batches' "$OUT/test_stream.txt" | head -n 5
fi
scan() {
    local name=$1 limit=$2
    shift 2
    timeout "$limit" "$B/bench/scan_bench" --data build-shared "$@" >"$OUT/scan_$name.txt" 2>&1
    echo "scan_bench $name exit $?"
    sed -n '/^median of iters/,/^$/p' "$OUT/scan_$name.txt"
    grep -A12 -E '^engines' "$OUT/scan_$name.txt" | grep -v '^engines' | grep -v '^ *$' |
        awk '{print "  passes", $1, $NF}'
    grep -E '^[a-z].* (no|NO)$' "$OUT/scan_$name.txt"
}
ALL=literals-1000,literals-10000,regex-500,regex-500-secrets,binary-20k,phrases-3k,dict-10,gitleaks-keywords,gitleaks-regex
if has all; then
    scan all-1m 300 --iters 5 --size 1G --buffer 1048576 --real-buffer 1048576 --only "$ALL"
fi
if has each; then
    # every workload in a process of its own (the in-process spread of
    # calls 1-7), Hyperscan in the same process after the GPU runs
    for w in ${ALL//,/ }; do
        scan each-$w 60 --iters 5 --size 1G --buffer 1048576 --real-buffer 1048576 --only "$w" |
            grep -E "^$w "
    done
fi
if has regex1g; then
    scan regex-1g 150 --iters 5 --size 1G --buffer 1073741824 --real-buffer 1073741824 --no-hs \
        --only regex-500,regex-500-secrets,gitleaks-regex,gitleaks-keywords,dict-10,phrases-3k
fi
if has heavy; then
    for h in 2048 512; do
        scan heavy$h-1m 120 --iters 5 --size 1G --buffer 1048576 --real-buffer 1048576 \
            --only gitleaks-regex,regex-500-secrets --heavy-states $h
        scan heavy$h-1g 120 --iters 5 --size 1G --buffer 1073741824 --real-buffer 1073741824 \
            --no-hs --only gitleaks-regex --heavy-states $h
    done
fi
if has stream; then
    W=/tmp/sb-work
    rm -rf $W && mkdir -p $W
    for min in ${MINS:-16K 0}; do
        "$B/daemon/vkscand" --config "" --socket $W/s.sock --state-dir $W/state --engine gpu \
            --log-level notice --stream-max-per-tenant 20000 --max-scan-bytes 8G \
            --tenant-max-bytes 16G --stream-gpu-min-bytes $min >"$OUT/vkscand_$min.log" 2>&1 &
        pid=$!
        for _ in $(seq 200); do grep -q "ready on" "$OUT/vkscand_$min.log" && break; sleep 0.1; done
        timeout 240 "$B/bench/stream_bench" --socket $W/s.sock --threads 16 --iters 3 \
            --only flows,large --streams 10000 --write 64K --rounds 2 --literals 10000 \
            --large 4G --large-write 16M --file /tmp/sb4g --data build-shared \
            >"$OUT/stream_$min.txt" 2>&1
        echo "stream_bench (stream-gpu-min-bytes $min) exit $?"
        grep -v '^ *iter' "$OUT/stream_$min.txt" | grep -E -A3 '^(flows|large):' | grep -v '^--'
        "$B/client/vkscan" --socket $W/s.sock status --json 2>/dev/null | tr ',' '\n' |
            grep -E '"stream\.(batch|writes)' | tr '\n' ' '
        echo
        kill $pid
        wait $pid 2>/dev/null
        grep -iE 'error|warn' "$OUT/vkscand_$min.log" | head -n 3
    done
    rm -f /tmp/sb4g
fi
