#!/usr/bin/env bash
# Session 48's GPU-host call: the CPU engine's split buffers with their
# unbounded groups in pieces (docs/engine.md "Unbounded catalogs on the CPU
# engine"). cli_bench (vkscand --engine cpu, `vkscan scan -c --no-cache` of
# a SIZE MiB file, medians of 3, Hyperscan on every core in the same run)
# for OLD and NEW, over build-cpuset (catalogs with unbounded groups beside
# bounded ones: leads, wordy-300, gitleaks-regex, dense-counters, on
# default.hay), then the CPU engine's piece counters. Carry .gl, both builds
# (release: daemon/vkscand, client/vkscan + libvkscan.so*, bench/hs_file)
# and build-cpuset. The daemon's cpu.* counters follow each build's table.
# OLD may name several builds (run in that order, then NEW); cpu_tel.sh
# follows for each build.
#   OLD="build-s48a ..." [SIZE=256] bench/h200_session48.sh NEW
set -u
NEW=${1:?usage: h200_session48.sh NEW}
D=$(dirname "$0")
. "$D/h200_env.sh"
nvidia-smi -L
nproc
cat /sys/kernel/mm/transparent_hugepage/enabled
for b in ${OLD:-build-s48a} "$NEW"; do
    echo "== $b ($(date +%T))"
    STATUS=1 OUT=$OUT/cpu-$(basename "$b") VKSCAN_ARGS=--no-cache WORK=/tmp/cb-work \
        timeout 280 "$D/cli_bench.sh" "$b" build-cpuset "${SIZE:-256}" 3 cpu
done
rm -rf /tmp/cb-work
for b in ${OLD:-build-s48a} "$NEW"; do
    echo "== cpu_tel $b"
    B=$b timeout 120 bash "$D/cpu_tel.sh"
done
echo "== done ($(date +%T))"
