#!/usr/bin/env bash
# Session 21's H200 calls. Carry .gl (with .gl/extra), BUILD (a release
# build), build-shared and build-data.
#
#   bench/h200_session21.sh BUILD [steps...]
#   steps: tests (test_gpu, test_stream's daemon case: h200_session14.sh)
#          large (issue 13: one $LARGE (16G) stream from a file in descriptor
#                 writes through vkscand, literals-10000, against block mode
#                 through the same daemon. For each daemon set-up of $CFGS
#                 (words "INFLIGHT" or "INFLIGHT:EXTRA-ARGS", ':' -> ' '), each
#                 window of $WINDOWS and each write size of $WRITES: the
#                 median table and, per batched write, where its time went)
#          rpc   (as h200_session18.sh: 4 KiB scans at 1-256 clients, 64 MiB)
set -u
B=${1:?usage: h200_session21.sh BUILD [steps...]}
shift
WHAT=${*:-tests large}
. "$(dirname "$0")/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
if has tests; then
    bash "$(dirname "$0")/h200_session14.sh" "$B" tests
fi
if has large; then
    W=/tmp/sb-work
    keys='batches|stream\.(batch_writes|batch_jobs|batch_[a-z_]*_ns|overlapped_writes)'
    lstats() {
        "$B/client/vkscan" --socket $W/s.sock status --json 2>/dev/null | tr ',' '\n' |
            grep -E "\"($keys)\"" | tr -d '"}' | sort | tr '\n' ' '
    }
    for cfg in ${CFGS:-2}; do
        inflight=${cfg%%:*}
        extra=""
        case "$cfg" in *:*) extra=$(echo "${cfg#*:}" | tr ':' ' ') ;; esac
        rm -rf $W && mkdir -p $W
        # shellcheck disable=SC2086
        "$B/daemon/vkscand" --config "" --socket $W/s.sock --state-dir $W/state --engine gpu \
            --log-level notice --max-scan-bytes 20G --tenant-max-bytes 40G \
            --inflight-batches "$inflight" $extra >"$OUT/vkscand_large.log" 2>&1 &
        pid=$!
        for _ in $(seq 200); do grep -q "ready on" "$OUT/vkscand_large.log" && break; sleep 0.1; done
        for wr in ${WRITES:-16M}; do
            for w in ${WINDOWS:-4 16}; do
                s0=$(lstats)
                timeout 200 "$B/bench/stream_bench" --socket $W/s.sock --threads 16 --iters 3 --no-hs \
                    --only large --literals 10000 --large "${LARGE:-16G}" --large-write "$wr" \
                    --file /tmp/sb16g --window $w >"$OUT/large.txt" 2>&1
                rc=$?
                s1=$(lstats)
                echo "== inflight $inflight${extra:+ ($extra)}, writes $wr, window $w: exit $rc"
                grep -E -A2 '^large:' "$OUT/large.txt" | tail -n 1
                echo "$s0 | $s1" | awk -F'|' '{
                    n = split($1, a, " "); for (i = 1; i <= n; i++) { split(a[i], kv, ":"); v0[kv[1]] = kv[2] }
                    n = split($2, b, " "); for (i = 1; i <= n; i++) { split(b[i], kv, ":"); v1[kv[1]] = kv[2] }
                    d = v1["stream.batch_writes"] - v0["stream.batch_writes"]; if (d == 0) d = 1
                    split("begin queue engine end fd_read plan upload device readback finalize idle", k, " ")
                    printf "  per batched write (%d), ms:", d
                    for (i = 1; i <= 11; i++) { f = "stream.batch_" k[i] "_ns"; printf " %s %.2f", k[i], (v1[f] - v0[f]) / d / 1e6 }
                    printf "; %.1f jobs per batch; %d batches\n", (v1["stream.batch_jobs"] - v0["stream.batch_jobs"]) / d, v1["batches"] - v0["batches"] }'
            done
        done
        "$B/client/vkscan" --socket $W/s.sock status 2>&1 | grep -E '^engine 0'
        kill $pid
        wait $pid 2>/dev/null
        grep -iE 'error|warn' "$OUT/vkscand_large.log" | head -n 3
    done
    [ -n "${KEEP_FILE:-}" ] || rm -f /tmp/sb16g
    rm -f "$OUT/large.txt"
fi
if has rpc; then
    bash "$(dirname "$0")/h200_session18.sh" "$B" rpc
fi
