#!/usr/bin/env bash
# Session 35's GPU-host call: where issues 10 and 13 stand on HEAD, and the
# GPU engine on IDS-like sets whose factors are common in the data. Carry
# .gl, BUILD (a release build), build-shared, build-data and build-wordy
# (bench/gen_wordy_ids.py 2000 7 and 300 11, tests/data/shapes' ids and
# dense-counters sets, sherlock.txt as default.hay).
#   bench/h200_session35.sh BUILD [steps...]
# Steps (in this order; each under its own timeout):
#   wordy    cli_bench over build-wordy, 256 MiB, 3 runs, --no-cache, the
#            auto engine, then the CPU engine
#   cli      cli_bench over build-data, 1 GiB, 3 runs, --no-cache
#   buf1g    scan_bench, one 1 GiB buffer, literals-1000
#   large    one 16 GiB stream, 256 MiB writes, window 8, count mode,
#            against block mode (stream_large_stats.sh)
#   flows    10,000 flows x 2 writes of 64 KiB: the GPU route twice, then
#            the CPU route (h200_session33.sh ab with OLD=BUILD)
#   big      64 clients of 64 MiB, inline and memfd (h200_session25.sh big)
#   restart  h200_restart.sh
# Summaries go to stdout and to $OUT/summary.txt.
set -u
B=${1:?usage: h200_session35.sh BUILD [steps...]}
shift
WHAT=${*:-wordy cli buf1g large flows big restart}
D=$(dirname "$0")
. "$D/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
S=$OUT/summary.txt
step() { echo "== $1 ($(date +%T))" | tee -a "$S"; }

if has wordy; then
    step "wordy, auto engine, 256 MiB"
    OUT=$OUT/wordy-auto VKSCAN_ARGS=--no-cache timeout 200 bash "$D/cli_bench.sh" "$B" build-wordy 256 3 2>&1 | tee -a "$S"
    step "wordy, cpu engine, 256 MiB"
    OUT=$OUT/wordy-cpu VKSCAN_ARGS=--no-cache timeout 120 bash "$D/cli_bench.sh" "$B" build-wordy 256 3 cpu 2>&1 | tee -a "$S"
fi
if has cli; then
    step "cli, 1 GiB"
    OUT=$OUT/cli VKSCAN_ARGS=--no-cache timeout 150 bash "$D/cli_bench.sh" "$B" build-data 1024 3 2>&1 | tee -a "$S"
fi
if has buf1g; then
    step "buf1g"
    timeout 100 "$B/bench/scan_bench" --size 1G --buffer 1G --iters 5 --threads 16 \
        --data build-shared --only literals-1000 2>&1 | grep -E "^literals|^workload|^telemetry" | tee -a "$S"
fi
if has large; then
    step "large, count mode"
    COUNT=1 timeout 150 bash "$D/stream_large_stats.sh" "$B" 2>&1 | cut -c1-600 | tee -a "$S"
fi
if has flows; then
    step "flows"
    OLD=$B ROUNDS=1 AB=$OUT/flows timeout 200 bash "$D/h200_session33.sh" "$B" ab 2>&1 | tee -a "$S"
fi
if has big; then
    step "big"
    timeout 100 bash "$D/h200_session25.sh" "$B" big 2>&1 | tee -a "$S"
fi
if has restart; then
    step "restart"
    timeout 120 bash "$D/h200_restart.sh" "$B" 2>&1 | tail -n 40 | tee -a "$S"
fi
