#!/usr/bin/env bash
# Session 36's GPU-host call: counting on the device (docs/gpu.md), OLD
# against NEW in one run, then where issue 10's CLI row stands on NEW.
# Carry .gl, OLD and NEW (release builds: OLD needs only daemon/vkscand,
# client/vkscan with libvkscan, bench/hs_file), build-data and build-wordy.
#   bench/h200_session36.sh OLD NEW [steps...]
# Steps: shapes (cli_bench over build-wordy, 256 MiB, 3 runs, --no-cache,
# both builds), cli (cli_bench over build-data, 1 GiB, NEW), stats (one
# scan of dense-counters through NEW, the engine counters that moved).
set -u
OLD=${1:?usage: h200_session36.sh OLD NEW [steps...]}
NEW=${2:?usage: h200_session36.sh OLD NEW [steps...]}
shift 2
WHAT=${*:-shapes stats cli}
D=$(dirname "$0")
. "$D/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
S=$OUT/summary.txt
step() { echo "== $1 ($(date +%T))" | tee -a "$S"; }
nvidia-smi -L | tee -a "$S"
if has shapes; then
    for b in "$OLD" "$NEW"; do
        step "$b: build-wordy, auto engine, 256 MiB"
        OUT=$OUT/shapes-$(basename "$b") VKSCAN_ARGS=--no-cache timeout 200 \
            bash "$D/cli_bench.sh" "$b" build-wordy 256 3 2>&1 | tee -a "$S"
    done
fi
if has stats; then
    step "$NEW: dense-counters, counters"
    timeout 100 bash "$D/probe_set.sh" "$NEW" build-wordy/default.hay 256 \
        build-wordy/dense-counters.rules 2>&1 | tail -n 30 | tee -a "$S"
fi
if has cli; then
    step "$NEW: build-data, 1 GiB"
    OUT=$OUT/cli VKSCAN_ARGS=--no-cache timeout 150 bash "$D/cli_bench.sh" "$NEW" build-data 1024 3 \
        2>&1 | tee -a "$S"
fi
