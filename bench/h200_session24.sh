#!/usr/bin/env bash
# Session 24's H200 calls. Carry .gl (with .gl/extra), BUILD (a release
# build with tests and benches), build-shared (a copy of ../shared/data),
# build-data and build-cli (as for h200_session23.sh).
#
#   bench/h200_session24.sh BUILD [steps...]
#   steps: tests   (test_gpu and test_stream's daemon case: h200_session14.sh)
#          restart (bench/h200_restart.sh: ready, first 4 KiB / 64 MiB after
#                   a restart, with the preload and warm-up and without)
#          confirm (bench/confirm_bench: forward confirmations alive past
#                   the GPU's cap on adversarial data, finished on the host)
#          scli    (the CLI's stream path: one 1 GiB file through
#                   `vkscan scan -c --no-cache` with vkscand at max-scan-bytes
#                   $PIECE (default 256M), so the file streams in pieces:
#                   count mode, gitleaks-regex's gated walks; then the same
#                   file as one request; hs_file beside it; $ITERS runs)
# Every step's output goes to stdout; run it with a timeout and a file.
set -u
B=${1:?usage: h200_session24.sh BUILD [steps...]}
shift
WHAT=${*:-tests}
D=$(dirname "$0")
. "$D/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }

if has tests; then
    bash "$D/h200_session14.sh" "$B" tests
fi
if has restart; then
    RESTARTS=${RESTARTS:-4} bash "$D/h200_restart.sh" "$B"
fi
if has confirm; then
    for t in 16 1; do
        echo "== confirm_bench mixed 16 x 64 MiB, --threads $t"
        "$B/bench/confirm_bench" --shape all --layout mixed --size 64M --buffers 16 --gpu 1 \
            --cap 0 --reps 3 --check 1 --threads $t
    done
    echo "== confirm_bench pem one 1 GiB"
    "$B/bench/confirm_bench" --shape pem --layout one --size 1G --buffers 1 --gpu 1 --cap 0 --reps 2
fi
if has scli; then
    for args in "--max-scan-bytes ${PIECE:-256M}" ""; do
        echo "== cli_bench, vkscand ${args:-defaults}"
        OUT=$OUT/cli VKSCAN_ARGS=--no-cache VKSCAND_ARGS="$args" \
            bash "$D/cli_bench.sh" "$B" build-cli 1024 "${ITERS:-3}"
    done
fi
