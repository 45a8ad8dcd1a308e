#!/usr/bin/env bash
# Session 39's GPU-host call: bench/gpu_diff.sh (random hit-dense rule sets,
# every hit through vkscand against the CPU reference) on the GPU engine
# and on engine auto. Carry .gl, BUILD (a release build's vkscand, vkscan,
# libvkscan) and SETS (bench/gen_random_sets.py SETS 200 3).
#   bench/h200_session39.sh BUILD SETS [SIZE_KIB] [JOBS]
set -u
BUILD=${1:?usage: h200_session39.sh BUILD SETS [SIZE_KIB] [JOBS]}
SETS=${2:?usage: h200_session39.sh BUILD SETS [SIZE_KIB] [JOBS]}
SIZE=${3:-4096}
JOBS=${4:-12}
D=$(dirname "$0")
. "$D/h200_env.sh"
nvidia-smi -L
echo "== engine gpu, $SIZE KiB ($(date +%T))"
OUT=$OUT/gpu VKSCAND_ARGS="--engine gpu" timeout 420 "$D/gpu_diff.sh" "$BUILD" "$SETS" "$SIZE" "$JOBS" >"$OUT/gpu.txt" 2>&1
grep -c DIFFERS "$OUT/gpu.txt"; head -n 30 "$OUT/gpu.txt" | cut -c1-600; tail -n 1 "$OUT/gpu.txt"
echo "== engine auto, 256 KiB ($(date +%T))"
OUT=$OUT/auto timeout 120 "$D/gpu_diff.sh" "$BUILD" "$SETS" 256 "$JOBS" >"$OUT/auto.txt" 2>&1
head -n 30 "$OUT/auto.txt" | cut -c1-600; tail -n 1 "$OUT/auto.txt"
echo "== done ($(date +%T))"
