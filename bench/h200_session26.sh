#!/usr/bin/env bash
# Session 26 on the H200 (docs/PERFORMANCE.md "Session 26"). Carry .gl and
# BUILD (a release build); `perf` needs build-perf, `cli` build-cli.
#   bench/h200_session26.sh BUILD [steps...]
# Steps:
#   tests  test_gpu, test_stream's daemon case, test_daemon's e2e case
#   big    64 MiB scans at 64 clients under each flag set of $CFGS
#          ("|"-separated; "" is the defaults; a set may start with
#          VAR=value words, put in vkscand's environment): sealed memfds
#          twice and inline once, 3 s each, then the scheduler's batch counts
#   perf   the last flag set again, vkscand under perf record while 64
#          clients send 64 MiB memfds for 4 s; threads and top symbols
#   restart1  three starts with a cached 10,000-literal catalog: the
#          telemetry of the first 64 MiB scan after each and of a warm one
#          (carry build-shared and build-data; $VKSCAND_ARGS: more flags)
#   cli    bench/cli_bench.sh on one 1 GiB file (build-cli's rule sets)
# Every step's output goes to stdout; run it with a timeout and a file.
set -u
B=${1:?usage: h200_session26.sh BUILD [steps...]}
shift
WHAT=${*:-tests}
D=$(dirname "$0")
. "$D/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }

# start_daemon LOG FLAGS...: vkscand on /tmp/v/s.sock, waits for ready.
start_daemon() {
    local log=$1
    shift
    local envs=()
    while [ $# -gt 0 ] && [[ $1 == *=* ]]; do envs+=("$1"); shift; done
    rm -rf /tmp/v && mkdir -p /tmp/v
    env "${envs[@]}" ${PREFIX:-} "$B/daemon/vkscand" --config "" --socket /tmp/v/s.sock \
        --state-dir /tmp/v/st --max-frame 80M --log-level notice "$@" >"$log" 2>&1 &
    d=$!
    for _ in $(seq 600); do grep -q "ready on" "$log" && break; sleep 0.1; done
}

status_line() {
    "$B/client/vkscan" status --socket /tmp/v/s.sock --json | tr ',' '\n' |
        grep -E '"(batches|batched_jobs|errors|scans)"' | tr '\n' ' '
    echo
}

if has tests; then
    bash "$D/h200_session14.sh" "$B" tests
    echo "== test_daemon e2e on the H200"
    ( cd "$B" && VKSCAND=$PWD/daemon/vkscand VKFAULT_SO=$PWD/tests/fault/libvkfault.so \
        READFAULT_SO=$PWD/tests/fault/libreadfault.so CK_RUN_CASE=e2e timeout 300 tests/test_daemon 2>&1 |
        grep -E "Checks|:F:|:E:" )
fi
IFS='|' read -r -a cfgs <<<"${CFGS:-}"
[ ${#cfgs[@]} -gt 0 ] || cfgs=("")
if has big; then
    for args in "${cfgs[@]}"; do
        # shellcheck disable=SC2086
        start_daemon "$OUT/vkscand-big.log" $args
        for ir in memfd:1 memfd:2 inline:1; do
            timeout 60 "$B/bench/rpc_bench" --socket /tmp/v/s.sock --seconds 3 --clients 64 \
                --workloads large --inputs "${ir%%:*}" --big-mib 64 | grep -E '^large' |
                sed "s/^/[${args:-defaults}] /"
        done
        echo "[${args:-defaults}] $(status_line)"
        kill -TERM $d
        wait $d
    done
fi
if has perf; then
    P="env LD_LIBRARY_PATH=$PWD/build-perf/lib:${LD_LIBRARY_PATH:-} build-perf/perf"
    # shellcheck disable=SC2086
    PREFIX="$P record -e cpu-clock -F 2999 -g -o /tmp/perf.data --" \
        start_daemon "$OUT/vkscand-perf.log" ${cfgs[-1]}
    timeout 60 "$B/bench/rpc_bench" --socket /tmp/v/s.sock --seconds 4 --clients 64 \
        --workloads large --inputs memfd --big-mib 64 | grep -E '^large' | sed 's/^/[perf] /'
    pkill -INT -f "$B/daemon/vkscand"
    sleep 4
    $P report -i /tmp/perf.data --no-children --sort comm -g none 2>/dev/null | grep '%' | head -n 12
    for c in vks-gpu vks-upload vkscand; do
        echo "== $c self"
        $P report -i /tmp/perf.data --comm $c --no-children --sort symbol -g none 2>/dev/null |
            grep '%' | head -n 25
    done
    echo "== vks-gpu children"
    $P report -i /tmp/perf.data --comm vks-gpu --children --sort symbol -g none 2>/dev/null |
        grep '%' | head -n 40
fi
if has restart1; then
    # one restart with the 10,000-literal catalog cached (h200_restart.sh's
    # set-up), then the telemetry of the first and a warm 64 MiB scan
    W=/tmp/rs3
    rm -rf $W && mkdir -p $W
    head -c 67108864 build-shared/rebar/haystacks/sherlock.txt >$W/f64 2>/dev/null
    while [ "$(stat -c %s $W/f64)" -lt 67108864 ]; do cat $W/f64 $W/f64 | head -c 67108864 >$W/t; mv $W/t $W/f64; done
    R=build-data/literals-10000.rules
    for i in 0 1 2; do
        # shellcheck disable=SC2086
        "$B/daemon/vkscand" --config "" --socket $W/s.sock --state-dir $W/st --log-level notice \
            ${VKSCAND_ARGS:-} >"$OUT/restart1.log" 2>&1 &
        d=$!
        for _ in $(seq 5000); do grep -q "ready on" "$OUT/restart1.log" && break; sleep 0.002; done
        for s in first warm; do
            VKSCAN_TELEMETRY=1 timeout 30 "$B/client/vkscan" --socket $W/s.sock scan -c --no-cache \
                -r $R $W/f64 2>&1 >/dev/null | tr ' ,' '\n\n' |
                grep -E '^"?(total_ns|queue_ns|fd_read_ns|plan_ns|buffers_made_ns|buffers_made_bytes|upload_ns|device_ns|readback_ns|finalize_ns|scan_ns|catalog_uploads|pipeline_compiles)' |
                tr '\n' ' ' | sed "s/^/start $i $s: /"
            echo
        done
        kill -TERM $d
        wait $d
    done
fi
if has cli; then
    OUT=$OUT/cli VKSCAN_ARGS=--no-cache timeout 400 bash "$D/cli_bench.sh" "$B" build-cli 1024 5
fi
