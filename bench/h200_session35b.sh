#!/usr/bin/env bash
# Session 35's second GPU-host call: span runs (compiler version 14) on the
# GPU and CPU engines, OLD against NEW in one run (bench/probe_set.sh: `vkscan
# scan -c --no-cache`, medians of 3, and the engine counters that moved).
# Carry .gl, OLD and NEW (release builds), build-data and build-wordy.
#   bench/h200_session35b.sh OLD NEW
set -u
OLD=${1:?usage: h200_session35b.sh OLD NEW}
NEW=${2:?usage: h200_session35b.sh OLD NEW}
D=$(dirname "$0")
W=build-wordy
for b in "$OLD" "$NEW"; do
    echo "== $b, auto engine, sherlock x 256 MiB"
    timeout 150 bash "$D/probe_set.sh" "$b" $W/default.hay 256 $W/one/dc-10.rules \
        $W/leads.rules $W/dense-counters.rules
    echo "== $b, auto engine, build-data/default.hay x 1 GiB"
    timeout 60 bash "$D/probe_set.sh" "$b" build-data/default.hay 1024 build-data/gitleaks-regex.rules
    echo "== $b, cpu engine, sherlock x 64 MiB"
    VKSCAND_ARGS="--engine cpu" timeout 60 bash "$D/probe_set.sh" "$b" $W/default.hay 64 \
        $W/one/dc-10.rules $W/leads.rules
done
