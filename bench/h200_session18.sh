#!/usr/bin/env bash
# Session 18's H200 calls. Carry .gl (with .gl/extra), BUILD (a release
# build), build-shared and build-data.
#
#   bench/h200_session18.sh BUILD [steps...]
#   steps: tests (test_gpu, test_stream's daemon case: h200_session14.sh)
#          engine (test_engine's daemon case through vkscand on the GPU)
#          prof  (regex-500-secrets --profile 1: where its kernel time goes)
#          spec  (regex-500-secrets with --fuse 0 and 1: its bounded group in the
#                 speculative pass or not; one 1 GiB buffer; the profile fused)
#          big   (scan_bench, each workload of $BIG as one 1 GiB buffer and as
#                 1,024 buffers of 1 MiB, medians of $ITERS, Hyperscan on 16
#                 threads; only the median table and the engines table kept)
#          fuse  (scan_bench, 1,024 buffers of 1 MiB: gitleaks-regex with fused
#                 DFA passes (--fuse 0, the default) and without (--fuse 1),
#                 the workloads of $FUSE_W once (nothing to fuse: the single
#                 kernel), gitleaks-regex's --profile 1 both ways, and one
#                 1 GiB buffer fused)
#          phr   (phrases-3k, one 1 GiB buffer against 1 MiB buffers, no
#                 Hyperscan, each iteration's kernel time and the telemetry)
#          large (issue 13: one $LARGE (16G) stream from a file in 16 MiB
#                 descriptor writes through vkscand, --window 1 and 4 writes in
#                 flight, against block mode through the same daemon; literals-10000)
#          rpc   (vkscand defaults under rpc_bench: 4 KiB scans at 1, 8, 64 and
#                 256 clients, 64 MiB memfd and inline at 1 and 64: through
#                 h200_dataplane.sh)
set -u
B=${1:?usage: h200_session18.sh BUILD [steps...]}
shift
WHAT=${*:-tests big rpc}
. "$(dirname "$0")/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
git rev-parse --short HEAD 2>/dev/null | sed 's/^/commit /'
if has tests; then
    bash "$(dirname "$0")/h200_session14.sh" "$B" tests
fi
if has engine; then # test_engine's daemon case: GPU scans through vkscand (slices included)
    VKSCAND=$B/daemon/vkscand VKSCAN=$B/client/vkscan CK_RUN_CASE=daemon timeout 240 \
        "$B/tests/test_engine" >"$OUT/test_engine.txt" 2>&1
    echo "test_engine (daemon) exit $?: $(grep -E 'Checks' "$OUT/test_engine.txt" | tail -n 1)"
    grep -E ':[EF]:' "$OUT/test_engine.txt" | head -n 5
fi
if has big; then
    for w in ${BIG:-binary-20k phrases-3k literals-10000}; do
        for buf in ${BUFS:-1G 1M}; do
            timeout 200 "$B/bench/scan_bench" --size 1G --buffer $buf --real-buffer $buf \
                --iters "${ITERS:-7}" --threads 16 --data build-shared --only "$w" \
                ${SB_ARGS:-} >"$OUT/sb.txt" 2>"$OUT/sb_err.txt"
            echo "== $w --buffer $buf (exit $?)"
            grep -A2 -E '^(median of iters|engines)' "$OUT/sb.txt" | grep -vE '^--'
            grep -E 'NO$' "$OUT/sb.txt"
        done
    done
    rm -f "$OUT/sb.txt" "$OUT/sb_err.txt"
fi
sb() { # NAME ARGS...: one scan_bench run, its median, engines and telemetry rows
    local name=$1
    shift
    timeout 200 "$B/bench/scan_bench" --size 1G --iters "${ITERS:-7}" --threads 16 \
        --data build-shared "$@" >"$OUT/sb.txt" 2>"$OUT/sb_err.txt"
    echo "== $name: $* (exit $?)"
    grep -A2 -E '^(median of iters|engines|telemetry|profile)' "$OUT/sb.txt" | grep -vE '^--'
    grep -E 'NO$' "$OUT/sb.txt"
    grep -vE 'iteration|warm-up' "$OUT/sb_err.txt" | tail -n 2
}
if has fuse; then
    for f in 0 1; do
        sb "gitleaks-regex fuse $f" --buffer 1M --real-buffer 1M --only gitleaks-regex --fuse $f
    done
    for w in ${FUSE_W:-regex-500-secrets regex-500}; do # nothing to fuse: the single kernel
        sb "$w" --buffer 1M --real-buffer 1M --only "$w"
    done
    for f in 0 1; do
        sb "gitleaks-regex profile fuse $f" --buffer 1M --real-buffer 1M --only gitleaks-regex \
            --fuse $f --profile 1 --iters 3
    done
    sb "gitleaks-regex 1G fuse 0" --buffer 1G --real-buffer 1G --only gitleaks-regex --iters 5
    rm -f "$OUT/sb.txt" "$OUT/sb_err.txt"
fi
if has spec; then # bounded groups in the speculative pass (spec_join), both ways
    for w in ${SPEC_W:-regex-500-secrets}; do
        for f in 0 1; do
            sb "$w fuse $f" --buffer 1M --real-buffer 1M --only "$w" --fuse $f
        done
        sb "$w 1G fuse 0" --buffer 1G --real-buffer 1G --only "$w" --iters 5 --no-hs
    done
    sb "regex-500-secrets profile fuse 0" --buffer 1M --real-buffer 1M --only regex-500-secrets \
        --profile 1 --iters 3
    rm -f "$OUT/sb.txt" "$OUT/sb_err.txt"
fi
if has prof; then
    sb "regex-500-secrets profile" --buffer 1M --real-buffer 1M --only regex-500-secrets \
        --profile 1 --iters 3
    rm -f "$OUT/sb.txt" "$OUT/sb_err.txt"
fi
if has phr; then
    for buf in 1G 1M 1G; do
        sb "phrases-3k $buf" --buffer $buf --real-buffer $buf --only phrases-3k --no-hs
        grep -E 'iteration|warm-up' "$OUT/sb_err.txt" | tr '\n' ' ' | sed 's/phrases-3k //g'
        echo
    done
    rm -f "$OUT/sb.txt" "$OUT/sb_err.txt"
fi
if has large; then
    W=/tmp/sb-work
    rm -rf $W && mkdir -p $W
    "$B/daemon/vkscand" --config "" --socket $W/s.sock --state-dir $W/state --engine gpu \
        --log-level notice --max-scan-bytes 20G --tenant-max-bytes 40G >"$OUT/vkscand_large.log" 2>&1 &
    pid=$!
    for _ in $(seq 200); do grep -q "ready on" "$OUT/vkscand_large.log" && break; sleep 0.1; done
    for w in ${WINDOWS:-1 4}; do
        timeout 280 "$B/bench/stream_bench" --socket $W/s.sock --threads 16 --iters 3 --no-hs \
            --only large --literals 10000 --large "${LARGE:-16G}" --large-write 16M \
            --file /tmp/sb16g --window $w >"$OUT/large.txt" 2>&1
        echo "stream_bench large --window $w exit $?"
        grep -E -A3 '^large:' "$OUT/large.txt"
    done
    "$B/client/vkscan" --socket $W/s.sock status 2>&1 | grep -E 'engine|served'
    kill $pid
    wait $pid 2>/dev/null
    grep -iE 'error|warn' "$OUT/vkscand_large.log" | head -n 3
    rm -f /tmp/sb16g "$OUT/large.txt"
fi
if has rpc; then
    RPC_ARGS=${RPC_ARGS:---seconds 2 --clients 1,8,64,256 --workloads small} FD_MODES=auto \
        OUT=$OUT/rpc bash "$(dirname "$0")/h200_dataplane.sh" "$B" rpc
    RPC_ARGS="--seconds 2 --clients 1,64 --workloads large" FD_MODES=auto \
        OUT=$OUT/rpc bash "$(dirname "$0")/h200_dataplane.sh" "$B" rpc
fi
