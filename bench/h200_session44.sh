#!/usr/bin/env bash
# Session 44's GPU-host calls. Carry .gl, build-shared and build-s42 (slim
# release builds, build-data, build-gated), linked into the tree by the
# command (for d in build-s42/*; do ln -sfn $d .; done).
#   [OLD=b] bench/h200_session44.sh NEW [steps...]
#   steps: buf1g (scan_bench, literals-1000, one 1 GiB buffer), where
#   (cli_where of gitleaks-regex, leads, wordy-300 and wordy-2000 for OLD
#   and NEW), pieces (the same for NEW against a vkscand with
#   --max-scan-bytes ${PIECE:-128M}: the CLI sends the 1 GiB file as a
#   stream of pieces), cli (h200_session41.sh's cli_bench of NEW, both
#   data folders), cpu (h200_session43.sh's cpu: OLD then NEW).
#   Default: buf1g where pieces.
set -u
NEW=${1:?usage: h200_session44.sh NEW [steps...]}
shift
WHAT=${*:-buf1g where pieces}
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
D=$(dirname "$0")
. "$D/h200_env.sh"
nvidia-smi -L
SETS_G=${WHERE_SETS:-leads wordy-300 wordy-2000}
SETS_D=${WHERE_DATA:-gitleaks-regex}
if has buf1g; then
    echo "== scan_bench $NEW literals-1000 1 GiB buffer ($(date +%T))"
    timeout 100 "$NEW/bench/scan_bench" --size 1G --buffer 1G --iters 5 --threads 16 \
        --data build-shared --only literals-1000 2>&1 | grep -E "^literals-1000|^workload"
fi
if has where; then
    OLD=${OLD:-} WHERE_DATA=$SETS_D WHERE_SETS=$SETS_G bash "$D/h200_session41.sh" "$NEW" where
fi
if has pieces; then
    echo "== pieces of ${PIECE:-128M} ($(date +%T))"
    DAEMON_ARGS="--max-scan-bytes ${PIECE:-128M}" WHERE_DATA=$SETS_D WHERE_SETS=$SETS_G \
        bash "$D/h200_session41.sh" "$NEW" where
fi
if has cli; then
    bash "$D/h200_session41.sh" "$NEW" cli
fi
if has cpu; then
    OLD=${OLD:-} bash "$D/h200_session43.sh" "$NEW" cpu
fi
echo "== done ($(date +%T))"
