#!/usr/bin/env bash
# Session 39's GPU-host calls: bench/gpu_diff.sh (random hit-dense rule
# sets, every hit through vkscand against the CPU reference) on the GPU
# engine and on engine auto, and bench/nfa_width_probe.sh. Carry .gl, BUILD
# (a release build's vkscand, vkscan, libvkscan) and SETS
# (bench/gen_random_sets.py SETS COUNT SEED).
#   bench/h200_session39.sh BUILD SETS [SIZE_KIB] [JOBS] [steps...]
#   steps: probe gpu auto (all three by default)
set -u
BUILD=${1:?usage: h200_session39.sh BUILD SETS [SIZE_KIB] [JOBS] [steps...]}
SETS=${2:?usage: h200_session39.sh BUILD SETS [SIZE_KIB] [JOBS] [steps...]}
SIZE=${3:-2048}
JOBS=${4:-12}
shift $(($# < 4 ? $# : 4))
WHAT=${*:-probe gpu auto}
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
D=$(dirname "$0")
. "$D/h200_env.sh"
nvidia-smi -L
if has probe; then
    echo "== nfa width probe ($(date +%T))"
    timeout 120 "$D/nfa_width_probe.sh" "$BUILD"
fi
if has gpu; then
    echo "== engine gpu, $SIZE KiB ($(date +%T))"
    OUT=$OUT/gpu VKSCAND_ARGS="--engine gpu" timeout 420 "$D/gpu_diff.sh" "$BUILD" "$SETS" "$SIZE" "$JOBS" >"$OUT/gpu.txt" 2>&1
    grep DIFFERS -A3 "$OUT/gpu.txt" | head -n 40 | cut -c1-700
    tail -n 1 "$OUT/gpu.txt"
    grep -v "ready on\|^engine 0\|preloaded\|SIGTERM\|drained" "$OUT/gpu/vkscand.log" | sort | uniq -c | sort -rn | head -n 10 | cut -c1-300
fi
if has auto; then
    echo "== engine auto, 256 KiB ($(date +%T))"
    OUT=$OUT/auto timeout 200 "$D/gpu_diff.sh" "$BUILD" "$SETS" 256 "$JOBS" >"$OUT/auto.txt" 2>&1
    grep DIFFERS -A3 "$OUT/auto.txt" | head -n 20 | cut -c1-700
    tail -n 1 "$OUT/auto.txt"
fi
echo "== done ($(date +%T))"
