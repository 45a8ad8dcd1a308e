#!/usr/bin/env bash
# Session 31's H200 calls. Carry .gl, build-shared, build-data, BUILD (a
# release build of HEAD) and OLD (a release build of d886431, session 29's
# last measured code; sessions 29's last call and 30 had no device).
#   bench/h200_session31.sh BUILD OLD [steps...]
# Steps:
#   small    4 KiB inline scans (rpc_bench, libvkscan clients) at 1, 8, 64
#            and 256 clients, 3 runs of 2 s each, vkscand at its defaults
#            (read-ahead 16K: libvkscan's hello allows it) and with
#            --read-ahead 0 (a request's length prefix and body in two
#            recvmsg, as before), the same binary, alternated twice; the
#            event loop's busy share and CPU time per request over each
#            64-client run (`vkscan status`: loop_busy_ns, loop_cpu_ns).
#            Expected: at 64 clients the loop thread, 98% busy at ~9 us a
#            request in session 25, spends one recvmsg less a request: its
#            CPU time a request 10-25% lower, requests/s 10-30% higher, p99
#            lower by about as much.
#   restart  bench/h200_session29.sh's restart (dict-10 and literals-10000,
#            --engine auto and cpu, OLD and BUILD alternated)
#   tests    test_gpu, test_stream's daemon case, test_daemon's e2e case
#   cpu      bench/cpu_shapes.sh on 16 threads, OLD and BUILD alternated
#   hsdiff   test_hsdiff (every random case also runs the CPU engine)
#   buf1g    scan_bench with one 1 GiB buffer: literals-1000 and regex-200
set -u
B=${1:?usage: h200_session31.sh BUILD OLD [steps...]}
OLD=${2:?usage: h200_session31.sh BUILD OLD [steps...]}
shift 2
WHAT=${*:-small restart tests}
D=$(dirname "$0")
. "$D/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }

snap() {
    "$B/client/vkscan" --socket /tmp/v/s.sock status --json | tr ',' '\n' |
        grep -E '"(uptime_ns|loop_busy_ns|loop_cpu_ns|scans)"' |
        sed 's/.*"\([a-z_.]*\)":\([0-9]*\).*/\1:\2/' | tr '\n' ' '
}
share() {
    echo "$1 | $2" | awk -F'|' '{
        n = split($1, a, " "); for (i = 1; i <= n; i++) { split(a[i], kv, ":"); v0[kv[1]] = kv[2] }
        n = split($2, b, " "); for (i = 1; i <= n; i++) { split(b[i], kv, ":"); v1[kv[1]] = kv[2] }
        up = v1["uptime_ns"] - v0["uptime_ns"]; sc = v1["scans"] - v0["scans"]
        printf "    loop busy %.0f%%, loop cpu %.2f us a request (%d scans)\n",
            100 * (v1["loop_busy_ns"] - v0["loop_busy_ns"]) / up,
            (v1["loop_cpu_ns"] - v0["loop_cpu_ns"]) / 1000 / (sc ? sc : 1), sc }'
}

if has small; then
    for round in 1 2; do
        for ra in 16K 0; do
            rm -rf /tmp/v && mkdir -p /tmp/v
            "$B/daemon/vkscand" --config "" --socket /tmp/v/s.sock --state-dir /tmp/v/st \
                --max-frame 80M --log-level notice --read-ahead $ra >"$OUT/vkscand-small.log" 2>&1 &
            d=$!
            for _ in $(seq 600); do grep -q "ready on" "$OUT/vkscand-small.log" && break; sleep 0.1; done
            "$B/bench/rpc_bench" --socket /tmp/v/s.sock --seconds 1 --clients 64 --workloads small \
                --inputs inline --big-mib 1 >/dev/null
            for c in 1 8 64 256; do
                for run in 1 2 3; do
                    s0=$(snap)
                    timeout 60 "$B/bench/rpc_bench" --socket /tmp/v/s.sock --seconds 2 --clients $c \
                        --workloads small --inputs inline --big-mib 1 | grep -E '^4KiB' |
                        sed "s/^/round $round read-ahead $ra c$c run $run: /"
                    [ $c = 64 ] && share "$s0" "$(snap)"
                done
            done
            "$B/client/vkscan" --socket /tmp/v/s.sock status --json | tr ',' '\n' |
                grep -E '"(read_ahead|errors|frame_errors)"' | tr '\n' ' '
            echo
            kill -TERM $d
            wait $d
        done
    done
fi
if has restart; then
    bash "$D/h200_session29.sh" "$B" "$OLD" restart
fi
if has tests; then
    bash "$D/h200_session26.sh" "$B" tests
fi
if has cpu; then
    THREADS=16 SIZE=1G ITERS=5 ROUNDS=${ROUNDS:-1} timeout 400 bash "$D/cpu_shapes.sh" "$OLD" "$B"
fi
if has hsdiff; then
    VKS_SHARED_DATA=$PWD/tests/data timeout 300 "$B/tests/test_hsdiff" 2>&1 | tail -n 25
fi
if has buf1g; then
    for w in literals-1000 regex-200; do
        timeout 150 "$B/bench/scan_bench" --size 1G --buffer 1G --iters 5 --threads 16 \
            --data build-shared --only $w 2>&1 | grep -E "^$w|^workload"
    done
fi
