#!/usr/bin/env bash
# Session 32's H200 calls. Carry .gl, build-shared, build-data and BUILD (a
# release build of HEAD).
#   bench/h200_session32.sh BUILD [steps...]
# Steps:
#   flows   issue 13's flows (10,000 streams x 2 writes of 64 KiB,
#           literals-10000, stream.writes of 64, 16 client threads), the GPU
#           route (stream-gpu-min-bytes 16K) and the CPU route (0), inline
#           and by memfd range, with the client's phase clocks (opens,
#           writes, closes) and the daemon's batch counters
#   buf1g   scan_bench with one 1 GiB buffer: literals-1000 and regex-200
#   cli     bench/cli_bench.sh over build-data, 1 GiB, 5 runs, --no-cache
#   ab      the flows' GPU route (16K, inline, b64) through OLD and BUILD
#           alternated (OLD=dir), each run's per-write phases (begin, queue,
#           engine, end) from the daemon's counters
#   engine  scan_bench literals-10000 as batches of 64 KiB buffers (the
#           flows' middles) against 1 MiB buffers of the same bytes:
#           where a batch of many small buffers spends its time
#   perf    the GPU route under perf (carry build-perf)
set -u
B=${1:?usage: h200_session32.sh BUILD [steps...]}
shift
WHAT=${*:-flows buf1g cli}
D=$(dirname "$0")
. "$D/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }

if has flows; then
    MINS=${MINS:-16K 0} MODES=b64 FDS=${FDS:-0 1} bash "$D/h200_session14.sh" "$B" flows
    # the GPU route once more, its daemon's counters kept: where a batched
    # write's time went (per write, loop clock) and the batches' shape
    W=/tmp/sb-stats
    rm -rf $W && mkdir -p $W
    "$B/daemon/vkscand" --config "" --socket $W/s.sock --state-dir $W/state --engine gpu \
        --log-level notice --stream-max-per-tenant 20000 --max-scan-bytes 8G \
        --tenant-max-bytes 16G --stream-gpu-min-bytes 16K >"$OUT/vkscand_stats.log" 2>&1 &
    pid=$!
    for _ in $(seq 200); do grep -q "ready on" "$OUT/vkscand_stats.log" && break; sleep 0.1; done
    timeout 200 "$B/bench/stream_bench" --socket $W/s.sock --threads 16 --iters 3 --only flows \
        --streams 10000 --write 64K --rounds 2 --literals 10000 --batch 64 --no-hs \
        --data build-shared >"$OUT/flows_stats.txt" 2>&1
    "$B/client/vkscan" --socket $W/s.sock status --json >"$OUT/flows_stats.json" 2>&1
    kill $pid
    wait $pid 2>/dev/null
    tr ',' '\n' <"$OUT/flows_stats.json" | tr -d '"{}' | awk -F: '
        { v[$(NF-1)] = $NF }
        END { n = v["stream.batch_writes"]; if (n == 0) n = 1
              printf "batched writes %d in %d batches (%.1f jobs a batch), loop busy %.0f%% of uptime\n",
                  v["stream.batch_writes"], v["batches"], v["batched_scans"] / (v["batches"] ? v["batches"] : 1),
                  100 * v["loop_busy_ns"] / v["uptime_ns"]
              split("begin queue engine end fd_read plan upload device readback finalize idle", k, " ")
              for (i = 1; i <= 11; i++)
                  printf "  %s %.0f us a write\n", k[i], v["stream.batch_" k[i] "_ns"] / n / 1000 }'
    for f in "$OUT"/flows_*.txt; do
        echo "== ${f##*/}"
        grep -E '^flows |per thread and run' "$f"
    done
fi
# flows_phases BUILD MIN LABEL: one flows run through BUILD's vkscand
# (stream-gpu-min-bytes MIN, inline, b64), its result and per-write phases
flows_phases() {
    local b=$1 min=$2 label=$3 W=/tmp/sb-ab
    rm -rf $W && mkdir -p $W
    "$b/daemon/vkscand" --config "" --socket $W/s.sock --state-dir $W/state --engine gpu \
        --log-level notice --stream-max-per-tenant 20000 --max-scan-bytes 8G \
        --tenant-max-bytes 16G --stream-gpu-min-bytes $min >"$AB/vkscand_ab.log" 2>&1 &
    local pid=$!
    for _ in $(seq 200); do grep -q "ready on" "$AB/vkscand_ab.log" && break; sleep 0.1; done
    timeout 200 "$b/bench/stream_bench" --socket $W/s.sock --threads 16 --iters 3 --only flows \
        --streams 10000 --write 64K --rounds 2 --literals 10000 --batch 64 ${FLOWS_ARGS:-} \
        --data build-shared >"$AB/ab_$label.txt" 2>&1
    "$b/client/vkscan" --socket $W/s.sock status --json >"$AB/ab_$label.json" 2>&1
    kill $pid
    wait $pid 2>/dev/null
    echo "$label: $(grep -E '^flows ' "$AB/ab_$label.txt" | awk '{print $2 " GB/s, hs " $3 ", hits " $7 " " $8 " " $9}')"
    tr ',' '\n' <"$AB/ab_$label.json" | tr -d '"{}' | awk -F: '
        { v[$(NF-1)] = $NF }
        END { n = v["stream.batch_writes"]; if (n == 0) n = 1
              printf "  %d batched writes in %d batches, %d ended on the loop; loop busy %.0f%%;",
                  v["stream.batch_writes"], v["batches"], v["stream.loop_ends"],
                  100 * v["loop_busy_ns"] / v["uptime_ns"]
              split("begin begin_wait begin_back queue engine end device finalize plan idle", k, " ")
              for (i = 1; i <= 10; i++)
                  printf " %s %.2f", k[i], v["stream.batch_" k[i] "_ns"] / n / 1e6
              printf " ms a write\n" }'
}
AB=${AB:-/tmp/sb-ab-out} # the runs' files (only the summaries are printed)
mkdir -p "$AB"
if has ab; then
    OLDB=${OLD:?OLD=build dir}
    for round in $(seq ${ROUNDS:-2}); do
        flows_phases "$OLDB" 16K "old_$round"
        flows_phases "$B" 16K "new_$round"
    done
    for extra in ${AB_EXTRA:-cpu c32 c64 cpu_c64}; do
        case $extra in
        cpu) flows_phases "$B" 0 "new_cpu" ;;
        cpu_c*) FLOWS_ARGS="--clients ${extra#cpu_c}" flows_phases "$B" 0 "new_$extra" ;;
        c*) FLOWS_ARGS="--clients ${extra#c}" flows_phases "$B" 16K "new_$extra" ;;
        esac
    done
fi
if has engine; then
    for size in 12M 64M; do
        for buf in 64K 1M; do
            echo "== literals-10000, $size as buffers of $buf"
            timeout 120 "$B/bench/scan_bench" --size $size --buffer $buf --iters 5 --threads 16 \
                --only literals-10000 --profile 1 --data build-shared 2>&1 |
                sed -n '/^median of iters/,$p' | grep -E "^literals|^median|^telemetry|^profile"
        done
    done
fi
if has buf1g; then
    for w in literals-1000 regex-200; do
        timeout 150 "$B/bench/scan_bench" --size 1G --buffer 1G --iters 5 --threads 16 \
            --data build-shared --only $w 2>&1 | grep -E "^$w|^workload"
    done
fi
if has cli; then
    VKSCAN_ARGS=--no-cache OUT=/tmp/cli-out timeout 400 bash "$D/cli_bench.sh" "$B" build-data 1024 5
fi
if has perf; then
    # the GPU route (16K) under perf: which threads and symbols take the time
    W=/tmp/sb-perf
    rm -rf $W && mkdir -p $W
    P="env LD_LIBRARY_PATH=$PWD/build-perf/lib:${LD_LIBRARY_PATH:-} build-perf/perf"
    $P record -e cpu-clock -F 1999 -g -o $W/perf.data -- "$B/daemon/vkscand" --config "" \
        --socket $W/s.sock --state-dir $W/state --engine gpu --log-level notice \
        --stream-max-per-tenant 20000 --stream-gpu-min-bytes ${PERF_MIN:-16K} \
        >"$OUT/perf_vkscand.log" 2>&1 &
    for _ in $(seq 200); do grep -q "ready on" "$OUT/perf_vkscand.log" && break; sleep 0.1; done
    timeout 200 "$B/bench/stream_bench" --socket $W/s.sock --threads 16 --iters 3 --only flows \
        --streams 10000 --write 64K --rounds 2 --literals 10000 --batch 64 --no-hs \
        --data build-shared >"$OUT/perf_flows.txt" 2>&1
    grep -E '^flows |per thread' "$OUT/perf_flows.txt"
    pkill -INT -f "$B/daemon/vkscand"
    sleep 4
    $P report -i $W/perf.data --no-children --sort comm -g none 2>/dev/null | grep '%' | head -n 20
    $P report -i $W/perf.data --no-children --sort comm,dso,symbol -g none 2>/dev/null |
        grep '%' | head -n 60 >"$OUT/perf_sym.txt"
    head -n 45 "$OUT/perf_sym.txt"
    echo "== the GPU worker thread (vks-gpu), self and with children"
    $P report -i $W/perf.data --comms vks-gpu --no-children --sort dso,symbol -g none 2>/dev/null |
        grep '%' | head -n 25
    $P report -i $W/perf.data --comms vks-gpu --children --sort symbol -g none 2>/dev/null |
        grep '%' | head -n 40
fi
