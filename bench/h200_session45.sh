#!/usr/bin/env bash
# Session 45's GPU-host calls. Carry .gl, build-shared and build-s42 (slim
# release builds, build-data, build-gated), linked into the tree by the
# command (for d in build-s42/*; do ln -sfn $d .; done).
#   bench/h200_session45.sh NEW [steps...]
#   steps:
#     buf1g   scan_bench, literals-1000, one 1 GiB buffer (engine alone)
#     pieces  cli_where of NEW for each piece size in PIECES (default
#             "whole 256M 128M 64M"): a vkscand with --max-scan-bytes of
#             that size, so the CLI sends each 1 GiB file as a stream of
#             such pieces ("whole": the default config, one request);
#             sets: PIECE_DATA of build-data (default gitleaks-regex
#             literals-10000 dict-10), PIECE_SETS of build-gated (default
#             leads wordy-300 wordy-2000)
#     rewalk  cli_where of OLD and NEW on leads (the re-walk jobs)
#     cli     cli_bench of NEW against Hyperscan, both data folders
#   Default: buf1g pieces.
set -u
NEW=${1:?usage: h200_session45.sh NEW [steps...]}
shift
WHAT=${*:-buf1g pieces}
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
D=$(dirname "$0")
. "$D/h200_env.sh"
nvidia-smi -L
pick() {
    grep " big " | tr ' ' '\n' | awk -F= '
        /^wall_s=/ { printf "\n%s %s", set, $0 }
        NF == 1 && !/=/ { if ($1 != "big") set = $1 }
        /^(total|plan|factor|factor_upload|factor_wait|factor_sort|device|run|upload|readback)_ns=/ {
            sub(/_ns$/, "", $1); printf " %s=%.1f", $1, $2 / 1e6 }
        /^(items_total|spec_fix_ns)=/ { printf " %s", $0 }
        END { print "" }'
}
if has buf1g; then
    echo "== scan_bench $NEW literals-1000 1 GiB buffer ($(date +%T))"
    timeout 100 "$NEW/bench/scan_bench" --size 1G --buffer 1G --iters 5 --threads 16 \
        --data build-shared --only literals-1000 2>&1 | grep -E "^literals-1000|^workload"
fi
if has pieces; then
    for p in ${PIECES:-whole 256M 128M 64M}; do
        args=""
        [ "$p" = whole ] || args="--max-scan-bytes $p"
        echo "== pieces $p build-data ($(date +%T))"
        DAEMON_ARGS=$args WORK=/tmp/p-data timeout 120 "$D/cli_where.sh" "$NEW" build-data \
            ${PIECE_DATA:-gitleaks-regex literals-10000 dict-10} | tee -a "$OUT/pieces-$p.txt" | pick
        echo "== pieces $p build-gated ($(date +%T))"
        DAEMON_ARGS=$args WORK=/tmp/p-gated timeout 150 "$D/cli_where.sh" "$NEW" build-gated \
            ${PIECE_SETS:-leads wordy-300 wordy-2000} | tee -a "$OUT/pieces-$p.txt" | pick
    done
    rm -rf /tmp/p-data /tmp/p-gated
fi
if has rewalk; then
    for b in ${OLD:-} "$NEW"; do
        echo "== rewalk $b leads ($(date +%T))"
        WORK=/tmp/w-gated timeout 100 "$D/cli_where.sh" "$b" build-gated leads |
            tee -a "$OUT/rewalk-$b.txt" | pick
    done
    rm -rf /tmp/w-gated
fi
if has cli; then
    bash "$D/h200_session41.sh" "$NEW" cli
fi
echo "== done ($(date +%T))"
