#!/usr/bin/env bash
# Session 37's first GPU-host call: session 36's unmeasured changes
# (counting in every kernel and in speculative ranges), OLD against NEW in
# one run, and where the 1 GiB CLI scan and the gated sets' host time go.
# Carry .gl, OLD, NEW, build-shared, build-data, build-wordy,
# build-probe-wordy-300 and build-probe-leads.
#   bench/h200_session37.sh OLD NEW [steps...]
# Steps (default all, in this order):
#   shapes   cli_bench over build-wordy, 256 MiB, 3 runs, OLD then NEW
#   cli      cli_bench over build-data, 1 GiB, 3 runs, OLD then NEW
#   where    cli_where.sh over build-data, NEW: telemetry of each scan
#   buf1g    scan_bench, one 1 GiB buffer, literals-1000, NEW
#   profile  scan_bench on wordy-300 and leads, 256 MiB, NEW (factor pass split)
set -u
OLD=${1:?usage: h200_session37.sh OLD NEW [steps...]}
NEW=${2:?usage: h200_session37.sh OLD NEW [steps...]}
shift 2
WHAT=${*:-shapes cli where buf1g profile}
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
D=$(dirname "$0")
. "$D/h200_env.sh"
S=$OUT/summary.txt
step() { echo "== $1 ($(date +%T))" | tee -a "$S"; }
nvidia-smi -L | tee -a "$S"
has shapes && for b in "$OLD" "$NEW"; do
    step "$b: build-wordy, 256 MiB"
    OUT=$OUT/shapes-$(basename "$b") VKSCAN_ARGS=--no-cache timeout 150 \
        bash "$D/cli_bench.sh" "$b" build-wordy 256 3 2>&1 | tee -a "$S"
done
has cli && for b in "$OLD" "$NEW"; do
    step "$b: build-data, 1 GiB"
    OUT=$OUT/cli-$(basename "$b") VKSCAN_ARGS=--no-cache timeout 150 \
        bash "$D/cli_bench.sh" "$b" build-data 1024 3 2>&1 | tee -a "$S"
done
if has where; then
    step "$NEW: cli_where, 1 GiB and 4 KiB"
    timeout 100 bash "$D/cli_where.sh" "$NEW" build-data 2>&1 | cut -c1-1500 >"$OUT/where.txt"
    cut -c1-400 "$OUT/where.txt" | tee -a "$S"
fi
if has buf1g; then
    step "$NEW: buf1g"
    timeout 90 "$NEW/bench/scan_bench" --size 1G --buffer 1G --iters 5 --threads 16 \
        --data build-shared --only literals-1000 2>&1 | grep -E "^literals|^workload|^telemetry" | tee -a "$S"
fi
has profile && for s in wordy-300 leads; do
    step "$NEW: scan_bench $s, 256 MiB"
    timeout 90 "$NEW/bench/scan_bench" --data build-probe-$s --only gitleaks-regex \
        --size 256M --iters 5 --threads 16 2>&1 |
        grep -v 'iteration\|warm-up' | tail -n 22 | tee -a "$S"
done
