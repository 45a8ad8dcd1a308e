#!/usr/bin/env bash
# Session 35's last GPU-host call: the CPU engine on 16 threads, OLD against
# NEW (bench/cli_bench.sh over build-cpu, 32 MiB, engine cpu, Hyperscan in
# the same run), then scan_bench's telemetry of NEW's GPU engine on leads
# and wordy-300 (build-probe-*: the set in place of gitleaks-regex).
# Carry .gl, OLD, NEW, build-cpu, build-probe-leads, build-probe-wordy-300.
#   bench/h200_session35c.sh OLD NEW
set -u
OLD=${1:?usage: h200_session35c.sh OLD NEW}
NEW=${2:?usage: h200_session35c.sh OLD NEW}
D=$(dirname "$0")
. "$D/h200_env.sh"
for b in "$OLD" "$NEW"; do
    echo "== $b, cpu engine, 32 MiB"
    OUT=/tmp/c35-$(basename "$b") VKSCAN_ARGS=--no-cache timeout 150 bash "$D/cli_bench.sh" "$b" build-cpu 32 3 cpu
done
for s in leads wordy-300; do
    echo "== $NEW, GPU engine, $s, 256 MiB"
    timeout 90 "$NEW/bench/scan_bench" --size 256M --iters 3 --threads 16 --data build-probe-$s \
        --only gitleaks-regex 2>&1 | grep -E -A2 "^workload|^telemetry"
done
