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
#   big    64 clients of 64 MiB memfd and inline scans (h200_session26.sh
#          big), BUILD at its default (memfds read at upload) and with
#          VKSCAND_FD_UPLOAD=map (mapped at load, the old default), twice
#   restart  exec to the first CLI scan answered, started at the socket
#          (bench/restart_local.sh, --engine auto), OLD then BUILD
#   shapes binary signatures and IDS-like sets (bench/gen_shapes.py) on
#          the GPU engine, OLD then BUILD: 1 GiB as 1 MiB buffers, Hyperscan
#          on 16 threads in the same run
set -u
B=${1:?usage: h200_session28.sh BUILD OLD [steps...]}
OLD=${2:?usage: h200_session28.sh BUILD OLD [steps...]}
shift 2
WHAT=${*:-tests flows big restart shapes cpu}
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
if has big; then
    for run in 1 2; do
        CFGS="|VKSCAND_FD_UPLOAD=map" bash "$D/h200_session26.sh" "$B" big
    done
fi
if has restart; then
    for b in "$OLD" "$B"; do
        echo "== restart: $b"
        RULES=build-shared/rebar/dict-10.rules bash "$D/restart_local.sh" "$b" 5 --engine auto
    done
fi
if has shapes; then
    S=/tmp/shapes-data
    for set in "anchors 400 1" "hexjump 400 2" "ids 400 5"; do
        rm -rf $S && mkdir -p $S/gitleaks $S/rebar/haystacks
        cp build-shared/rebar/haystacks/sherlock.txt $S/rebar/haystacks/
        # shellcheck disable=SC2086
        python3 "$D/gen_shapes.py" $set >$S/gitleaks/gitleaks-regex.rules
        for b in "$OLD" "$B"; do
            echo "== shapes $set: $b"
            timeout 300 "$b/bench/scan_bench" --size 1G --buffer 1048576 --iters 5 \
                --only gitleaks-regex --data $S | grep -E '^gitleaks-regex ' | head -n 2
        done
    done
fi
