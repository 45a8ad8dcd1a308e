#!/usr/bin/env bash
# Session 40's GPU-host calls: where one `vkscan scan -c` of a 1 GiB file
# spends its time for the regex sets (bench/cli_where.sh), for OLD (when
# set) and BUILD in turn; scan_bench's plan of leads as one 256 MiB buffer;
# bench/gpu_diff.sh over sparse random sets at a large size. Carry .gl,
# BUILD and OLD (release vkscand, vkscan, libvkscan, scan_bench), build-data,
# build-gated, build-probe-{leads,wordy-300,gitleaks-regex} and SETS (SPARSE=1
# bench/gen_random_sets.py SETS COUNT SEED).
#   [OLD=build] bench/h200_session40.sh BUILD SETS [SIZE_KIB] [steps...]
#   steps: where plan sparse (all by default)
set -u
BUILD=${1:?usage: h200_session40.sh BUILD SETS [SIZE_KIB] [steps...]}
SETS=${2:?usage: h200_session40.sh BUILD SETS [SIZE_KIB] [steps...]}
SIZE=${3:-16384}
shift $(($# < 3 ? $# : 3))
WHAT=${*:-where plan sparse}
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
D=$(dirname "$0")
. "$D/h200_env.sh"
nvidia-smi -L
# the wall time and the telemetry's main parts (ms) of the 1 GiB scans
pick() {
    grep " big " | tr ' ' '\n' | awk -F= '
        /^wall_s=/ { printf "\n%s %s", set, $0 }
        NF == 1 && !/=/ { if ($1 != "big") set = $1 }
        /^(total|plan|factor|device|run|upload|readback|finalize|fd_read)_ns=/ {
            sub(/_ns$/, "", $1); printf " %s=%.1f", $1, $2 / 1e6 }
        END { print "" }'
}
if has where; then
    for b in ${OLD:-} "$BUILD"; do
        echo "== cli_where $b build-data ($(date +%T))"
        WORK=/tmp/w-data timeout 150 "$D/cli_where.sh" "$b" build-data gitleaks-regex |
            tee -a "$OUT/where-$b.txt" | pick
        echo "== cli_where $b build-gated ($(date +%T))"
        WORK=/tmp/w-gated timeout 150 "$D/cli_where.sh" "$b" build-gated leads wordy-300 |
            tee -a "$OUT/where-$b.txt" | pick
    done
    rm -rf /tmp/w-data /tmp/w-gated
fi
if has plan; then
    for spec in ${PLAN_SETS:-leads:256M wordy-300:256M gitleaks-regex:1G}; do
        IFS=: read -r set size <<<"$spec"
        for b in ${OLD:-} "$BUILD"; do
            echo "== scan_bench $b $set, one $size buffer ($(date +%T))"
            timeout 90 "$b/bench/scan_bench" --data "build-probe-$set" --only gitleaks-regex \
                --size "$size" --buffer "$size" --threads 16 --iters 5 --no-hs 2>&1 |
                grep -A1 -E "^(workload|telemetry|main plan|factor)" | grep -v "^--"
        done
    done
fi
if has sparse; then
    echo "== sparse sets, engine gpu, $SIZE KiB ($(date +%T))"
    OUT=$OUT/sparse VKSCAND_ARGS="--engine gpu" timeout 120 "$D/gpu_diff.sh" "$BUILD" "$SETS" "$SIZE" 12 \
        >"$OUT/sparse.txt" 2>&1
    grep DIFFERS -A3 "$OUT/sparse.txt" | head -n 30 | cut -c1-500
    tail -n 3 "$OUT/sparse.txt"
fi
echo "== done ($(date +%T))"
