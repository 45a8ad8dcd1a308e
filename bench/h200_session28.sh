#!/usr/bin/env bash
# The next H200 call after sessions 27-28 (neither was lent a device).
# Carry .gl, build-shared, build-data, BUILD (a release build of HEAD) and
# OLD (a release build of 8555a56, session 26's last measured commit).
#   bench/h200_session28.sh BUILD OLD [steps...]
# Steps:
#   tests  test_gpu, test_stream's daemon case, test_daemon's e2e case (BUILD)
#   cpu    session 27's CPU literal matcher, OLD and BUILD alternated
#   flows  issue 13's flows (10,000 streams x 2 writes of 64 KiB,
#          literals-10000, stream.writes of 64, inline and by memfd), on the
#          GPU route (stream-gpu-min-bytes 16K) and the CPU route (0), OLD
#          then BUILD, twice. Session 28 took the per-write mmap/munmap pairs
#          off the GPU route (docs/PERFORMANCE.md "Session 28"): expected
#          there 1.5 GB/s -> several GB/s if the loop thread's unmaps were
#          what held it.
set -u
B=${1:?usage: h200_session28.sh BUILD OLD [steps...]}
OLD=${2:?usage: h200_session28.sh BUILD OLD [steps...]}
shift 2
WHAT=${*:-tests flows cpu}
D=$(dirname "$0")
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }

if has tests; then
    bash "$D/h200_session27.sh" "$B" "$OLD" tests
fi
if has flows; then
    for run in 1 2; do
        for b in "$OLD" "$B"; do
            echo "== flows run $run: $b"
            MINS="16K 0" MODES=b64 FDS="0 1" bash "$D/h200_session14.sh" "$b" flows
        done
    done
fi
if has cpu; then
    bash "$D/h200_session27.sh" "$B" "$OLD" cpu
fi
