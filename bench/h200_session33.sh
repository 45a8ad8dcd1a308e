#!/usr/bin/env bash
# Session 33's GPU-host calls. Carry .gl, build-shared, build-data, BUILD and
# OLD (release builds of HEAD and of the build to compare with).
#   OLD=build-old bench/h200_session33.sh BUILD [steps...]
# Steps:
#   begin  stream_bench --only begin: a batched write's begin and end in
#          user space (no system calls), against a whole write, one thread
#   ab     issue 13's flows (10,000 streams x 2 writes of 64 KiB,
#          literals-10000, stream.writes of 64, 16 clients) on the GPU route
#          (stream-gpu-min-bytes 16K) through OLD and BUILD alternated
#          (ROUNDS, default 2), then BUILD's CPU route (0): GB/s, Hyperscan's
#          stream mode in the same run, per-write phases, the threads' time a
#          write (stream.run_ns), the fstat calls, new head-and-tail buffers
#          (NEW_FIRST=1: BUILD first in each round; CPU=0: no CPU route run)
#   knobs  BUILD's GPU route at inflight-batches 1, 2 (the default), 4 and 8
#   buf1g  scan_bench, one 1 GiB buffer, literals-1000 (issue 10's engine alone)
#   cli    bench/cli_bench.sh over build-data, 1 GiB, 3 runs, --no-cache
#   perf   BUILD's GPU route of the flows under perf (carry build-perf): the
#          CPU engine threads' (vks-cpu) symbols, user and kernel
# Only summaries go to stdout; each run's whole output stays in $AB.
set -u
B=${1:?usage: h200_session33.sh BUILD [steps...]}
shift
WHAT=${*:-begin ab buf1g cli}
D=$(dirname "$0")
. "$D/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
AB=${AB:-/tmp/s33-out}
mkdir -p "$AB"

if has begin; then
    "$B/bench/stream_bench" --only begin --streams 10000 --rounds 2 --write 64K --literals 10000 \
        --no-hs --data build-shared 2>&1 | grep -A1 "^begin:"
fi

# flows BUILD MIN LABEL: one flows run through BUILD's vkscand
flows() {
    local b=$1 min=$2 label=$3 W=/tmp/s33-w
    rm -rf $W && mkdir -p $W
    "$b/daemon/vkscand" --config "" --socket $W/s.sock --state-dir $W/state --engine gpu \
        --log-level notice --stream-max-per-tenant 20000 --max-scan-bytes 8G \
        --tenant-max-bytes 16G --stream-gpu-min-bytes $min ${DAEMON_ARGS:-} \
        >"$AB/vkscand_$label.log" 2>&1 &
    local pid=$!
    for _ in $(seq 200); do grep -q "ready on" "$AB/vkscand_$label.log" && break; sleep 0.1; done
    timeout 200 "$b/bench/stream_bench" --socket $W/s.sock --threads 16 --iters 3 --only flows \
        --streams 10000 --write 64K --rounds 2 --literals 10000 --batch 64 ${FLOWS_ARGS:-} \
        --data build-shared >"$AB/flows_$label.txt" 2>&1
    "$b/client/vkscan" --socket $W/s.sock status --json >"$AB/flows_$label.json" 2>&1
    kill $pid
    wait $pid 2>/dev/null
    echo "$label: $(grep -E '^flows ' "$AB/flows_$label.txt" | awk '{print $2 " GB/s, hs " $3 ", hits " $7 " " $8 " " $9}');" \
        "$(grep -o 'writes [0-9.]* s' "$AB/flows_$label.txt") (client, per thread and run)"
    tr ',' '\n' <"$AB/flows_$label.json" | tr -d '"{}' | awk -F: '
        { v[$(NF-1)] = $NF }
        END { n = v["stream.batch_writes"]; w = v["stream.writes"]; if (n == 0) n = 1
              printf "  %d writes, %d batched in %d batches; thread %.1f us a write; fstat %d; new buffers %d;",
                  w, v["stream.batch_writes"], v["batches"], v["stream.run_ns"] / (w ? w : 1) / 1e3,
                  v["stream.fd_stats"], v["stream.sparse_mapped"]
              split("begin begin_wait begin_back queue engine device finalize plan upload fd_read idle", k, " ")
              for (i = 1; i <= 11; i++)
                  printf " %s %.2f", k[i], v["stream.batch_" k[i] "_ns"] / n / 1e6
              printf " ms a batched write\n" }'
}
if has ab; then
    OLDB=${OLD:?OLD=build dir}
    for round in $(seq ${ROUNDS:-2}); do
        if [ "${NEW_FIRST:-0}" = 1 ]; then
            flows "$B" 16K "new_$round"
            flows "$OLDB" 16K "old_$round"
        else
            flows "$OLDB" 16K "old_$round"
            flows "$B" 16K "new_$round"
        fi
    done
    [ "${CPU:-1}" = 1 ] && flows "$B" 0 new_cpu
fi
if has knobs; then
    for n in 1 2 4 8; do DAEMON_ARGS="--inflight-batches $n" flows "$B" 16K "inflight_$n"; done
fi
if has buf1g; then
    timeout 150 "$B/bench/scan_bench" --size 1G --buffer 1G --iters 5 --threads 16 \
        --data build-shared --only literals-1000 2>&1 | grep -E "^literals|^workload|^telemetry"
fi
if has cli; then
    VKSCAN_ARGS=--no-cache OUT=/tmp/cli-out timeout 300 bash "$D/cli_bench.sh" "$B" build-data 1024 3
fi
if has perf; then
    W=/tmp/s33-perf
    rm -rf $W && mkdir -p $W
    P="env LD_LIBRARY_PATH=$PWD/build-perf/lib:${LD_LIBRARY_PATH:-} build-perf/perf"
    $P record -e cpu-clock -F 4999 -g -o $W/perf.data -- "$B/daemon/vkscand" --config "" \
        --socket $W/s.sock --state-dir $W/state --engine gpu --log-level notice \
        --stream-max-per-tenant 20000 --stream-gpu-min-bytes 16K >"$AB/perf_vkscand.log" 2>&1 &
    for _ in $(seq 200); do grep -q "ready on" "$AB/perf_vkscand.log" && break; sleep 0.1; done
    timeout 200 "$B/bench/stream_bench" --socket $W/s.sock --threads 16 --iters 3 --only flows \
        --streams 10000 --write 64K --rounds 2 --literals 10000 --batch 64 --no-hs \
        --data build-data >"$AB/perf_flows.txt" 2>&1
    grep -E '^flows ' "$AB/perf_flows.txt"
    "$B/client/vkscan" --socket $W/s.sock status --json | tr ',' '\n' | tr -d '"{}' |
        grep -E '^stream.(writes|run_ns|sparse_mapped|sparse_reused):'
    pkill -INT -f "$B/daemon/vkscand"
    sleep 4
    $P report -i $W/perf.data --no-children --sort comm -g none 2>/dev/null | grep '%' | head -n 12
    echo "== vks-cpu, self"
    $P report -i $W/perf.data --comms vks-cpu --no-children --sort dso,symbol -g none 2>/dev/null |
        grep '%' | head -n 45
    echo "== vks-cpu, with children (kernel paths)"
    $P report -i $W/perf.data --comms vks-cpu --children --sort symbol -g none 2>/dev/null |
        grep '%' | head -n 45
fi
