#!/usr/bin/env bash
# Issue 13's flows shape through two vkscand builds, alternated, on this
# machine (lavapipe where there is no GPU): 1,000 streams x 2 writes of
# 64 KiB, literals-10000, stream.writes of 64 as ranges of a memfd, 2
# client threads, the middles in GPU batches (stream-gpu-min-bytes 16K).
# Prints each run's GB/s (median of 5 iterations) and what the daemon's
# loop thread spent (loop_cpu_ns), with the head-and-tail buffers made and
# reused. docs/PERFORMANCE.md "Session 28".
#   bench/flows_ab.sh OLD_BUILD NEW_BUILD [ROUNDS]
set -u
OLD=${1:?usage: flows_ab.sh OLD_BUILD NEW_BUILD [ROUNDS]}
NEW=${2:?usage: flows_ab.sh OLD_BUILD NEW_BUILD [ROUNDS]}
ROUNDS=${3:-3}
DATA=${DATA:-build-shared}
W=$(mktemp -d /tmp/flows_ab.XXXXXX)
trap 'rm -rf "$W"' EXIT
for r in $(seq "$ROUNDS"); do
    for b in "$OLD" "$NEW"; do
        rm -rf "$W/state" "$W/s.sock"
        "$b/daemon/vkscand" --config "" --socket "$W/s.sock" --state-dir "$W/state" --engine gpu \
            --log-level notice --stream-max-per-tenant 20000 --max-scan-bytes 8G \
            --tenant-max-bytes 16G --stream-gpu-min-bytes "${MIN:-16K}" >"$W/d.log" 2>&1 &
        pid=$!
        for _ in $(seq 300); do grep -q "ready on" "$W/d.log" && break; sleep 0.1; done
        gbs=$("$NEW/bench/stream_bench" --socket "$W/s.sock" --threads 2 --iters 5 --only flows \
            --streams 1000 --write 64K --rounds 2 --literals 10000 --batch 64 --flows-fd --no-hs \
            --data "$DATA" 2>&1 | awk '/^flows /{print $2}')
        st=$("$NEW/client/vkscan" --socket "$W/s.sock" status --json | tr ',' '\n' |
            grep -E '"(loop_cpu_ns|batches|batched_scans|stream.sparse_(reused|mapped))"' |
            tr -d '"{' | tr '\n' ' ')
        echo "round $r $b: flows ${gbs:-failed} GB/s | $st"
        kill "$pid"
        wait "$pid" 2>/dev/null
    done
done
