#!/usr/bin/env bash
# Session 14's H200 calls: pipelined stream writes (libvkscan's
# vks_stream_write_send / _recv) from stream_bench's flows through vkscand.
# Carry .gl (with .gl/extra), BUILD, build-shared, build-data.
#
#   bench/h200_session14.sh BUILD [steps...]
#   steps: tests (test_gpu, and test_stream's daemon case on the GPU)
#          flows (10,000 streams of 64 KiB writes against literals-10000:
#          for each stream-gpu-min-bytes in MINS (default "16K 0"), each
#          mode in MODES (default "w1 w64": wN pipelined writes in flight,
#          bN writes per stream.writes), inline and by memfd range (FDS),
#          with the daemon's loop-thread busy and CPU share over the run)
#          each (every scan_bench workload in its own process)
#          perf (vkscand under perf record -e cpu-clock during flows b64 by
#          memfd: the top symbols of the loop thread and of all threads;
#          carry build-perf: perf and its libraries, glibc left out)
set -u
B=${1:?usage: h200_session14.sh BUILD [steps...]}
shift
WHAT=${*:-tests flows}
. "$(dirname "$0")/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
if has tests; then
    timeout 120 "$B/tests/test_gpu" >"$OUT/test_gpu.txt" 2>&1
    echo "test_gpu exit $?: $(grep -E 'Checks' "$OUT/test_gpu.txt" | tail -n 1)"
    grep -E ':[EF]:' "$OUT/test_gpu.txt" | head -n 5
    VKSCAND=$B/daemon/vkscand VKSCAN=$B/client/vkscan READFAULT_SO=$PWD/$B/tests/fault/libreadfault.so \
        CK_RUN_CASE=daemon timeout 200 \
        "$B/tests/test_stream" >"$OUT/test_stream.txt" 2>&1
    echo "test_stream (daemon) exit $?: $(grep -E 'Checks' "$OUT/test_stream.txt" | tail -n 1)"
    grep -E ':[EF]:|gpu batches|pipelined' "$OUT/test_stream.txt" | head -n 5
fi
if has flows; then
    # MODES: wN (N pipelined writes in flight per connection), bN (N writes
    # per stream.writes request); FDS: 0 inline, 1 memfd ranges
    W=/tmp/sb-work
    MS=${MINS:-16K 0} MO=${MODES:-w1 w64}
    for min in $MS; do
        rm -rf $W && mkdir -p $W
        "$B/daemon/vkscand" --config "" --socket $W/s.sock --state-dir $W/state --engine gpu \
            --log-level notice --stream-max-per-tenant 20000 --max-scan-bytes 8G \
            --tenant-max-bytes 16G --stream-gpu-min-bytes $min ${DAEMON_ARGS:-} \
            >"$OUT/vkscand_$min.log" 2>&1 &
        pid=$!
        for _ in $(seq 200); do grep -q "ready on" "$OUT/vkscand_$min.log" && break; sleep 0.1; done
        for mode in $MO; do
            for fd in ${FDS:-0 1}; do
                name=flows_${min}_${mode}_fd$fd
                hs=--no-hs
                [ "$mode" = "${MO%% *}" ] && [ "$fd" = 0 ] && [ "$min" = "${MS%% *}" ] && hs=
                case $mode in w*) m="--window ${mode#w}" ;; b*) m="--batch ${mode#b}" ;; esac
                l0=$("$B/client/vkscan" --socket $W/s.sock status --json 2>/dev/null | tr ',' '\n' |
                    grep -E '"(uptime_ns|loop_busy_ns|loop_cpu_ns|stream.run_ns|cpu_threads)"' |
                    sed 's/.*://' | tr '\n' ' ')
                timeout 200 "$B/bench/stream_bench" --socket $W/s.sock --threads 16 --iters 3 \
                    --only flows --streams 10000 --write 64K --rounds 2 --literals 10000 \
                    $m $([ "$fd" = 1 ] && echo --flows-fd) $hs --data build-shared \
                    >"$OUT/$name.txt" 2>&1
                rc=$?
                l1=$("$B/client/vkscan" --socket $W/s.sock status --json 2>/dev/null | tr ',' '\n' |
                    grep -E '"(uptime_ns|loop_busy_ns|loop_cpu_ns|stream.run_ns|cpu_threads)"' |
                    sed 's/.*://' | tr '\n' ' ')
                # fields: uptime busy cpu cpu_threads run_ns (stats order)
                loop=$(echo "$l0 $l1" | awk '{w = $6 - $1; printf "loop busy %.0f%% cpu %.0f%%, %d threads %.0f%% in writes", 100 * ($7 - $2) / w, 100 * ($8 - $3) / w, $9, 100 * ($10 - $5) / ($9 * w)}')
                echo "$name exit $rc: $(grep -E '^flows ' "$OUT/$name.txt") | $loop"
            done
        done
        "$B/client/vkscan" --socket $W/s.sock status --json 2>/dev/null | tr ',' '\n' |
            grep -E '"(stream\.(batch_writes|batch_gpu|writes)|batches|batched_scans)"' | tr '\n' ' '
        echo
        kill $pid
        wait $pid 2>/dev/null
        grep -iE 'error|warn' "$OUT/vkscand_$min.log" | head -n 3
    done
fi
if has perf; then
    W=/tmp/sb-perf
    rm -rf $W && mkdir -p $W
    P="env LD_LIBRARY_PATH=$PWD/build-perf/lib:${LD_LIBRARY_PATH:-} build-perf/perf"
    $P record -e cpu-clock -F 999 -g -o $W/perf.data -- "$B/daemon/vkscand" --config "" \
        --socket $W/s.sock --state-dir $W/state --engine gpu --log-level notice \
        --stream-max-per-tenant 20000 --stream-gpu-min-bytes 0 >"$OUT/perf_vkscand.log" 2>&1 &
    for _ in $(seq 200); do grep -q "ready on" "$OUT/perf_vkscand.log" && break; sleep 0.1; done
    timeout 200 "$B/bench/stream_bench" --socket $W/s.sock --threads 16 --iters 3 --only flows \
        --streams 10000 --write 64K --rounds 2 --literals 10000 --batch 64 --flows-fd --no-hs \
        --data build-shared >"$OUT/perf_flows.txt" 2>&1
    grep -E '^flows ' "$OUT/perf_flows.txt"
    pkill -INT -f "$B/daemon/vkscand"
    sleep 4
    head -n 5 "$OUT/perf_vkscand.log"
    $P report -i $W/perf.data --no-children --sort comm,symbol -g none 2>/dev/null |
        grep '%' | head -n 40 >"$OUT/perf_all.txt"
    cat "$OUT/perf_all.txt"
    $P report -i $W/perf.data --no-children --sort tid -g none 2>/dev/null | grep '%' | head -n 12
fi
ALL=literals-1000,literals-10000,regex-500,regex-500-secrets,binary-20k,phrases-3k,dict-10,gitleaks-keywords,gitleaks-regex
if has each; then
    for w in ${EACH:-${ALL//,/ }}; do
        timeout 60 "$B/bench/scan_bench" --data build-shared --iters 5 --size 1G --buffer 1048576 \
            --real-buffer 1048576 --only "$w" >"$OUT/scan_each-$w.txt" 2>&1
        echo "scan_bench $w exit $?"
        sed -n '/^median of iters/,/^$/p' "$OUT/scan_each-$w.txt" | grep -E "^$w "
    done
fi
