#!/usr/bin/env bash
# Session 23's H200 calls. Carry .gl (with .gl/extra), BUILD (a release
# build) and build-shared (a copy of ../shared/data).
#
#   bench/h200_session23.sh BUILD [steps...]
#   steps: gate   (regex-500-secrets, gitleaks-regex and regex-500 at the
#                  default gating and at each of $GATES (scan_bench options,
#                  `|`-separated), 1 GiB as 1 MiB buffers, medians of
#                  $ITERS, Hyperscan on 16 threads in the same process;
#                  then regex-500-secrets with --profile 1 per setting)
#          tests  (test_gpu and test_stream's daemon case: h200_session14.sh)
#          all    (every issue-9 workload at the default settings, 1 MiB
#                  buffers and one 1 GiB buffer)
set -u
B=${1:?usage: h200_session23.sh BUILD [steps...]}
shift
WHAT=${*:-gate}
. "$(dirname "$0")/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
D=$(dirname "$0")
ITERS=${ITERS:-7}
SB() { "$B/bench/scan_bench" --size 1G --real-buffer 1M --iters "$ITERS" --threads 16 \
    --data build-shared "$@" 2>>"$OUT/scan_bench.err"; }
if has tests; then
    bash "$D/h200_session14.sh" "$B" tests
fi
if has gate; then
    IFS='|' read -r -a SETS <<<"${GATES:---gate-bits 21}"
    for w in ${GWORK:-regex-500-secrets gitleaks-regex regex-500}; do
        echo "== $w default"
        SB --buffer 1M --only "$w" | tail -n 2
        for s in "${SETS[@]}"; do
            echo "== $w $s"
            # shellcheck disable=SC2086
            SB --buffer 1M --only "$w" $s | tail -n 2
        done
    done
    for s in "" "${SETS[@]}"; do
        echo "== regex-500-secrets profile ${s:-default}"
        # shellcheck disable=SC2086
        ITERS=3 SB --buffer 1M --only regex-500-secrets --profile 1 $s 2>&1 | tail -n 8
        echo "== regex-500-secrets 1G buffer ${s:-default}"
        # shellcheck disable=SC2086
        SB --buffer 1G --only regex-500-secrets $s | tail -n 2
    done
fi
if has all; then
    for w in ${AWORK:-gitleaks-regex regex-500 regex-500-secrets dict-10 gitleaks-keywords binary-20k phrases-3k literals-1000 literals-10000}; do
        for buf in 1M 1G; do
            echo "== $w --buffer $buf"
            SB --buffer $buf --only "$w" | tail -n 2
        done
    done
fi
