#!/usr/bin/env bash
# Session 41's GPU-host calls. Carry .gl and one folder holding BUILD (and
# OLD builds: release vkscand, vkscan, libvkscan, scan_bench, hs_file),
# build-data and build-gated (rule sets and default.hay, as for
# cli_bench.sh), linked into the tree by the command.
#   [OLD="b1 b2"] bench/h200_session41.sh BUILD [steps...]
#   steps: cli (cli_bench of BUILD against Hyperscan, 1 GiB files, both
#   data folders), where (cli_where of gitleaks-regex, leads and wordy-300
#   for OLD and BUILD; WHERE_DATA, WHERE_SETS: other build-data and
#   build-gated sets), diff
#   (gpu_diff.sh over sets-dense and sets-sparse when carried). Default:
#   cli where.
set -u
BUILD=${1:?usage: h200_session41.sh BUILD [steps...]}
shift
WHAT=${*:-cli where}
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
D=$(dirname "$0")
. "$D/h200_env.sh"
nvidia-smi -L
pick() {
    grep " big " | tr ' ' '\n' | awk -F= '
        /^wall_s=/ { printf "\n%s %s", set, $0 }
        NF == 1 && !/=/ { if ($1 != "big") set = $1 }
        /^(total|plan|plan_pre|factor|factor_upload|factor_wait|factor_sort|device|run|upload|readback|finalize|fd_read)_ns=/ {
            sub(/_ns$/, "", $1); printf " %s=%.1f", $1, $2 / 1e6 }
        /^(items_total|items_processed|plan_runs_ns|spec_fixes|spec_fix_bytes|spec_fix_ns)=/ { printf " %s", $0 }
        END { print "" }'
}
if has cli; then
    for data in build-data build-gated; do
        echo "== cli_bench $BUILD $data ($(date +%T))"
        OUT=$OUT/cli-$data WORK=/tmp/cb-$data VKSCAN_ARGS=--no-cache timeout 280 \
            "$D/cli_bench.sh" "$BUILD" "$data" 1024 3
        rm -rf /tmp/cb-$data
    done
fi
if has where; then
    for b in ${OLD:-} "$BUILD"; do
        echo "== cli_where $b build-data ($(date +%T))"
        WORK=/tmp/w-data timeout 100 "$D/cli_where.sh" "$b" build-data ${WHERE_DATA:-gitleaks-regex} |
            tee -a "$OUT/where-$b.txt" | pick
        echo "== cli_where $b build-gated ($(date +%T))"
        WORK=/tmp/w-gated timeout 150 "$D/cli_where.sh" "$b" build-gated ${WHERE_SETS:-leads wordy-300} |
            tee -a "$OUT/where-$b.txt" | pick
    done
    rm -rf /tmp/w-gated /tmp/w-data
fi
if has diff; then
    # gpu_diff (files: read at upload, so plan_runs) over random sets:
    # sets-dense (gen_random_sets.py, 2 MiB files) and sets-sparse (SPARSE=1,
    # 16 MiB files), engine gpu, against the reference scanner
    for spec in sets-dense:2048 sets-sparse:16384; do
        IFS=: read -r sets size <<<"$spec"
        [ -d "$sets" ] || continue
        echo "== gpu_diff $BUILD $sets $size KiB ($(date +%T))"
        OUT=$OUT/diff-$sets VKSCAND_ARGS="--engine gpu" timeout ${DIFF_S:-120} "$D/gpu_diff.sh" "$BUILD" \
            "$sets" "$size" 12 >"$OUT/diff-$sets.txt" 2>&1
        grep DIFFERS -A3 "$OUT/diff-$sets.txt" | head -n 20 | cut -c1-400
        tail -n 2 "$OUT/diff-$sets.txt"
    done
fi
echo "== done ($(date +%T))"
