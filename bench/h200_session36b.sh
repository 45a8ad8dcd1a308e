#!/usr/bin/env bash
# Session 36's second GPU-host call: counting on the device in all three
# kernels, OLD against NEW on 1 GiB files (cli_bench over build-data), NEW
# on the project's shapes (build-wordy, 256 MiB), and
# where the GPU's host time goes on gated sets (scan_bench over the
# build-probe-* folders, 256 MiB: the factor pass's parts).
# Carry .gl, OLD, NEW, build-data, build-wordy, build-probe-wordy-300 and
# build-probe-leads.
#   bench/h200_session36b.sh OLD NEW [steps...]
# Steps (default all, in this order): shapes cli profile.
set -u
OLD=${1:?usage: h200_session36b.sh OLD NEW [steps...]}
NEW=${2:?usage: h200_session36b.sh OLD NEW [steps...]}
shift 2
WHAT=${*:-shapes cli profile}
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
D=$(dirname "$0")
. "$D/h200_env.sh"
S=$OUT/summary.txt
step() { echo "== $1 ($(date +%T))" | tee -a "$S"; }
nvidia-smi -L | tee -a "$S"
if has shapes; then
    step "$NEW: build-wordy, auto engine, 256 MiB"
    OUT=$OUT/shapes VKSCAN_ARGS=--no-cache timeout 200 bash "$D/cli_bench.sh" "$NEW" build-wordy \
        256 3 2>&1 | tee -a "$S"
fi
has cli && for b in "$OLD" "$NEW"; do
    step "$b: build-data, 1 GiB"
    OUT=$OUT/cli-$(basename "$b") VKSCAN_ARGS=--no-cache timeout 150 \
        bash "$D/cli_bench.sh" "$b" build-data 1024 3 2>&1 | tee -a "$S"
done
has profile && for s in wordy-300 leads; do
    for p in 0; do
        step "$NEW: scan_bench $s, 256 MiB, profile $p"
        timeout 100 "$NEW/bench/scan_bench" --data build-probe-$s --only gitleaks-regex \
            --size 256M --iters 5 --threads 16 --profile $p 2>&1 |
            grep -v 'iteration\|warm-up' | tail -n 22 | tee -a "$S"
    done
done
