#!/usr/bin/env bash
# What session 27 (no H200 lent) left for the next H200 call: the CPU
# literal matcher's change (rules/cpulit.c advance(), docs/PERFORMANCE.md
# "Session 27") on 16 threads, and issue 13's flows on the CPU route that
# it feeds. Carry .gl, build-shared, build-data, BUILD and OLD (release
# builds of 11e4fa5 or later, and of 8555a56).
#   bench/h200_session27.sh BUILD OLD [steps...]
# Steps:
#   tests  test_gpu, test_stream's daemon case, test_daemon's e2e case (BUILD)
#   cpu    scan_bench --engine cpu, 16 threads, 1 GiB of each literal
#          workload, OLD and BUILD alternated 3 times (Hyperscan on 16
#          threads in the same process)
#   flows  10,000 streams x 2 writes of 64 KiB, literals-10000, on the CPU
#          route (stream-gpu-min-bytes 0), OLD then BUILD
set -u
B=${1:?usage: h200_session27.sh BUILD OLD [steps...]}
OLD=${2:?usage: h200_session27.sh BUILD OLD [steps...]}
shift 2
WHAT=${*:-tests cpu flows}
D=$(dirname "$0")
. "$D/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }

if has tests; then
    bash "$D/h200_session26.sh" "$B" tests
fi
if has cpu; then
    for run in 1 2 3; do
        for b in "$OLD" "$B"; do
            echo "== cpu run $run: $b"
            timeout 300 "$b/bench/scan_bench" --engine cpu --threads 16 --size 1G --iters 5 \
                --only literals-1000,literals-10000,binary-20k,dict-10 --data build-shared |
                grep -E '^(literals|binary|dict)'
        done
    done
fi
if has flows; then
    for b in "$OLD" "$B"; do
        echo "== flows: $b"
        MINS=0 MODES=b64 FDS="0 1" bash "$D/h200_session14.sh" "$b" flows
    done
fi
