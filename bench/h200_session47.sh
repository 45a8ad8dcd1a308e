#!/usr/bin/env bash
# Session 47's GPU-host calls: a 1 GiB file streamed in pieces (what
# `vkscan scan` does for a file over max-scan-bytes) for OLD and NEW
# builds, one request for NEW, and Hyperscan over the same file. Carry
# .gl, the builds (release: daemon/vkscand, client/vkscan, bench/hs_file),
# build-data and build-gated (rule sets and default.hay).
#   [OLD=build-old] [PIECE=256M] bench/h200_session47.sh NEW [steps...]
#   steps: pieces (cli_where of OLD and NEW with --max-scan-bytes PIECE),
#          whole (cli_where of NEW, default config), hs (bench/hs_file on 16
#          threads, median of 5 scans). Sets: PIECE_DATA of build-data
#          (default gitleaks-regex dict-10), PIECE_SETS of build-gated
#          (default leads wordy-300).
set -u
NEW=${1:?usage: h200_session47.sh NEW [steps...]}
shift
WHAT=${*:-pieces whole hs}
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
D=$(dirname "$0")
. "$D/h200_env.sh"
nvidia-smi -L
nproc
pick() {
    grep " big " | tr ' ' '\n' | awk -F= '
        /^wall_s=/ { printf "\n%s %s", set, $0 }
        /^counts_md5=/ { printf " %s", $0 }
        NF == 1 && !/=/ { if ($1 != "big") set = $1 }
        /^(total|plan|factor|device|run|upload|readback)_ns=/ {
            sub(/_ns$/, "", $1); printf " %s=%.1f", $1, $2 / 1e6 }
        END { print "" }'
}
pick_status() { tee >(grep "stream.run_ns" >&2) | pick; }
DATA_SETS=${PIECE_DATA:-gitleaks-regex dict-10}
GATED_SETS=${PIECE_SETS:-leads wordy-300}
where() { # where BUILD LABEL DAEMON_ARGS
    echo "== $2 $1 build-data ($(date +%T))"
    STATUS=1 DAEMON_ARGS=$3 WORK=/tmp/p-data timeout 150 "$D/cli_where.sh" "$1" build-data $DATA_SETS |
        tee -a "$OUT/$2-$(basename "$1").txt" | pick_status
    echo "== $2 $1 build-gated ($(date +%T))"
    STATUS=1 DAEMON_ARGS=$3 WORK=/tmp/p-gated timeout 150 "$D/cli_where.sh" "$1" build-gated $GATED_SETS |
        tee -a "$OUT/$2-$(basename "$1").txt" | pick_status
}
if has pieces; then
    for b in ${OLD:-build-old} "$NEW"; do
        where "$b" "pieces-${PIECE:-256M}" "--max-scan-bytes ${PIECE:-256M}"
    done
fi
has whole && where "$NEW" whole ""
if has hs; then
    for s in $DATA_SETS; do
        echo "hs $s $("$NEW/bench/hs_file" build-data/$s.rules /tmp/p-data/big --threads 16 --iters 5)"
    done
    for s in $GATED_SETS; do
        echo "hs $s $("$NEW/bench/hs_file" build-gated/$s.rules /tmp/p-gated/big --threads 16 --iters 5)"
    done
fi
rm -rf /tmp/p-data /tmp/p-gated
echo "== done ($(date +%T))"
