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
    # stream.batch_*: where a batched write's time goes (session 19)
    lstats() {
        "$B/client/vkscan" --socket $W/s.sock status --json 2>/dev/null | tr ',' '\n' |
            grep -E '"(batches|stream\.(batch_writes|batch_jobs|batch_begin_ns|batch_queue_ns|batch_engine_ns|batch_end_ns|overlapped_writes))"' |
            tr -d '"}' | sort | tr '\n' ' '
    }
    for w in ${WINDOWS:-1 4}; do
        s0=$(lstats)
        timeout 280 "$B/bench/stream_bench" --socket $W/s.sock --threads 16 --iters 3 --no-hs \
            --only large --literals 10000 --large "${LARGE:-16G}" --large-write 16M \
            --file /tmp/sb16g --window $w >"$OUT/large.txt" 2>&1
        echo "stream_bench large --window $w exit $?"
        grep -E -A3 '^large:' "$OUT/large.txt"
        s1=$(lstats)
        # per batched write, ms: begin (queued on its stream -> middle queued),
        # queue (in the scheduler), engine (the batch's wall), end (back -> answered)
        echo "$s0 | $s1" | awk -F'|' '{
            n = split($1, a, " "); for (i = 1; i <= n; i++) { split(a[i], kv, ":"); v0[kv[1]] = kv[2] }
            n = split($2, b, " "); for (i = 1; i <= n; i++) { split(b[i], kv, ":"); v1[kv[1]] = kv[2] }
            d = v1["stream.batch_writes"] - v0["stream.batch_writes"]; if (d == 0) d = 1
            printf "  per batched write (%d): begin %.2f ms, queue %.2f, engine %.2f, end %.2f; %.1f jobs per batch seen; %d batches, %d overlapped\n", d,
                (v1["stream.batch_begin_ns"] - v0["stream.batch_begin_ns"]) / d / 1e6,
                (v1["stream.batch_queue_ns"] - v0["stream.batch_queue_ns"]) / d / 1e6,
                (v1["stream.batch_engine_ns"] - v0["stream.batch_engine_ns"]) / d / 1e6,
                (v1["stream.batch_end_ns"] - v0["stream.batch_end_ns"]) / d / 1e6,
                (v1["stream.batch_jobs"] - v0["stream.batch_jobs"]) / d,
                v1["batches"] - v0["batches"], v1["stream.overlapped_writes"] - v0["stream.overlapped_writes"] }'
    done
    "$B/client/vkscan" --socket $W/s.sock status 2>&1 | grep -E 'engine|served'
    # the CLI on the same file: one request (max-scan-bytes 20G: block mode,
    # in slices) and, through a daemon of max-scan-bytes 256M, as a stream of
    # 16 MiB descriptor writes (four in flight since session 19); dict-10
    if [ -n "${CLI_FILE:-}" ]; then
        "$B/daemon/vkscand" --config "" --socket $W/t.sock --state-dir $W/state2 --engine gpu \
            --log-level notice --max-scan-bytes 256M >"$OUT/vkscand_t.log" 2>&1 &
        pid2=$!
        for _ in $(seq 200); do grep -q "ready on" "$OUT/vkscand_t.log" && break; sleep 0.1; done
        for sock in s t; do
            for i in 1 2 3 4; do
                t0=$(date +%s.%N)
                out=$("$B/client/vkscan" --socket $W/$sock.sock scan -c --no-cache \
                    -r build-data/dict-10.rules /tmp/sb16g 2>&1 | wc -l)
                t1=$(date +%s.%N)
                echo "cli $([ $sock = s ] && echo block || echo stream) run $i: $(echo "$t0 $t1" | awk '{printf "%.3f s, %.2f GB/s", $2 - $1, 17.179869184 / ($2 - $1)}'), $out lines"
            done
        done
        kill $pid2
        wait $pid2 2>/dev/null
    fi
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
