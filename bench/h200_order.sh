#!/usr/bin/env bash
# Why a workload's kernel is 2-5x slower when other workloads ran before it
# in the same scan_bench process (docs/PERFORMANCE.md, session 12 call 7,
# session 13 calls 1-2): regex-500 and regex-500-secrets alone, after
# literals-1000, and after literals-10000 (scan_bench runs its table order), each a process of its own,
# with --profile 1 (device time per kind of dispatch) so the slower kind
# shows. Carry .gl (with .gl/extra), BUILD, build-shared, build-data.
#
#   bench/h200_order.sh BUILD [hs]
# hs: instead, the first four workloads with and without Hyperscan's runs
# between them (does a previous workload's Hyperscan run slow the next
# workload's kernel?).
set -u
B=${1:?usage: h200_order.sh BUILD [hs]}
MODE=${2:-order}
. "$(dirname "$0")/h200_env.sh"
run() {
    local name=$1
    shift
    timeout 150 "$B/bench/scan_bench" --data build-shared --iters 5 --size 1G --buffer 1048576 \
        --real-buffer 1048576 "$@" >"$OUT/order_$name.txt" 2>&1
    echo "== $name exit $?"
    sed -n '/^median of iters/,/^$/p' "$OUT/order_$name.txt" | grep -v '^$'
    sed -n '/^profile/,/^$/p' "$OUT/order_$name.txt" | grep -v '^$'
}
if [ "$MODE" = hs ]; then
    F=literals-1000,literals-10000,regex-500,regex-500-secrets
    run four-hs --only $F
    run four-nohs --no-hs --only $F
    run four-hs-again --only $F
    exit 0
fi
run alone --no-hs --profile 1 --only regex-500,regex-500-secrets
run after-lit --no-hs --profile 1 --only literals-1000,regex-500,regex-500-secrets
run after-lit10k --no-hs --profile 1 --only literals-10000,regex-500,regex-500-secrets
run alone-noprof --no-hs --only regex-500,regex-500-secrets
run after-lit-noprof --no-hs --only literals-1000,regex-500,regex-500-secrets
