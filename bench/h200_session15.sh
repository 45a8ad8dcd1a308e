#!/usr/bin/env bash
# Session 15's H200 calls: where one 1 GiB file's `vkscan scan -c` spends
# its time in vkscand. Carry .gl (with .gl/extra), BUILD (vkscand, vkscan,
# libvkscan, bench/hs_file; a slim copy is enough), build-data, and for
# `prof` build-perf (perf and its libraries, glibc left out).
#
#   bench/h200_session15.sh BUILD [steps...]
#   steps: prof (vkscand under perf record -e cpu-clock while each rule set
#               of build-data scans the file RUNS times with telemetry: top
#               symbols by thread name)
#          cli  (bench/cli_bench.sh, medians of 5, and the telemetry of RUNS
#               more scans of each set)
#          import (bench/import_bench on the 1 GiB file: pread into staging
#               against VK_EXT_external_memory_host imports, medians of 5)
set -u
B=${1:?usage: h200_session15.sh BUILD [steps...]}
shift
WHAT=${*:-cli}
. "$(dirname "$0")/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
W=/tmp/s15
mkdir -p $W
big=$W/default.big
if [ "$(stat -c %s $big 2>/dev/null)" != 1073741824 ]; then # exactly 1 GiB of the haystack
    reps=$((1073741824 / $(stat -c %s build-data/default.hay) + 1))
    for _ in $(seq $reps); do cat build-data/default.hay; done | head -c 1073741824 >$big
fi
cat $big >/dev/null
TEL='^(client_rpc_ns|connect_ns|rules_ns|finish_ns|factor_ns|plan_ns|upload_ns|run_ns|readback_ns|device_ns|finalize_ns|hits_raw|reply_ns|encode_ns)='
tel_runs() { # SOCK: RUNS scans of each set with VKSCAN_TELEMETRY, one line each
    for r in build-data/*.rules; do
        n=$(basename "$r" .rules)
        "$B/client/vkscan" --socket "$1" scan -c --no-cache -r "$r" $big >/dev/null 2>&1
        for _ in $(seq "${RUNS:-3}"); do
            t0=$(date +%s.%N)
            VKSCAN_TELEMETRY=1 "$B/client/vkscan" --socket "$1" scan -c --no-cache -r "$r" $big \
                2>$W/tel.txt >/dev/null
            t1=$(date +%s.%N)
            echo "tel $n $(awk -v a=$t0 -v b=$t1 'BEGIN {printf "%.3f s", b - a}'): $(tr ' ' '\n' \
                <$W/tel.txt | grep -E "$TEL" | tr '\n' ' ')"
        done
    done
}
if has prof; then
    P="env LD_LIBRARY_PATH=$PWD/build-perf/lib:${LD_LIBRARY_PATH:-} build-perf/perf"
    rm -rf $W/state
    PB=${PROF_B:-$B} # a build with frame pointers gives call chains (-g)
    $P record -e cpu-clock -F 2999 -g -o $W/perf.data -- "$PB/daemon/vkscand" --config "" \
        --socket $W/p.sock --state-dir $W/state --log-level notice >"$OUT/prof_vkscand.log" 2>&1 &
    for _ in $(seq 200); do grep -q "ready on" "$OUT/prof_vkscand.log" && break; sleep 0.1; done
    tel_runs $W/p.sock
    pkill -INT -f "$PB/daemon/vkscand"
    sleep 4
    $P report -i $W/perf.data --no-children -g none --sort comm,symbol 2>/dev/null | grep '%' |
        head -n 45 >"$OUT/prof_symbols.txt"
    cat "$OUT/prof_symbols.txt"
    echo "== finish phases (a build with the FIN timing lines)"
    grep -E "^(FIN|sortns)" "$OUT/prof_vkscand.log" | tail -n 24
    echo "== inclusive, engine threads"
    $P report -i $W/perf.data --children -g none --comm vks-gpu,vks-upload --sort symbol \
        2>/dev/null | grep '%' | head -n 45
    $P report -i $W/perf.data --no-children --sort comm 2>/dev/null | grep '%' | head -n 12
fi
if has import; then
    for pop in "" --populate; do
        echo "== import_bench $pop"
        "$B/bench/import_bench" --file $big --iters 5 $pop 2>&1
    done
    echo "== import_bench memfd"
    "$B/bench/import_bench" --size 1073741824 --iters 5 2>&1
fi
if has cli; then
    OUT=$W/cliout WORK=$W/cli VKSCAN_ARGS=--no-cache timeout 240 \
        bench/cli_bench.sh "$B" build-data 1024 "${ITERS:-5}" auto >"$OUT/cli_bench.txt" 2>&1
    echo "cli_bench exit $?"
    cat "$OUT/cli_bench.txt"
    rm -rf $W/state
    "$B/daemon/vkscand" --config "" --socket $W/t.sock --state-dir $W/state --log-level notice \
        >"$OUT/tel_vkscand.log" 2>&1 &
    dpid=$!
    for _ in $(seq 200); do grep -q "ready on" "$OUT/tel_vkscand.log" && break; sleep 0.1; done
    tel_runs $W/t.sock
    kill $dpid
fi
