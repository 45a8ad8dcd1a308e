#!/usr/bin/env bash
# Session 22's H200 calls. Carry .gl (with .gl/extra), BUILD (a release
# build), build-shared and build-data.
#
#   bench/h200_session22.sh BUILD [steps...]
#   steps: tests  (test_gpu, test_stream's daemon case: h200_session14.sh)
#          large  (h200_session21.sh large: $CFGS, $WINDOWS, $WRITES)
#          cli16  (after large, on its 16 GiB file: `vkscan scan -c` with
#                  dict-10 through a default-config vkscand, where the file
#                  is over max-scan-bytes and streams in descriptor pieces,
#                  and through one with max-scan-bytes 20G (one request in
#                  slices); hs_file on 16 threads over the same file)
#          flows  (h200_session14.sh flows: $MINS, $MODES, $FDS)
#          perf   (vkscand under perf record -e cpu-clock during one 16 GiB
#                  stream of $PWRITE (256M) writes, window $PWIN (8): the top
#                  symbols of the engine thread (vks-gpu), of the upload
#                  threads and of all; carry build-perf: perf and its
#                  libraries, glibc left out)
set -u
B=${1:?usage: h200_session22.sh BUILD [steps...]}
shift
WHAT=${*:-tests large}
. "$(dirname "$0")/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
D=$(dirname "$0")
if has tests; then
    bash "$D/h200_session14.sh" "$B" tests
fi
if has large; then
    KEEP_FILE=$(has cli16 && echo 1) bash "$D/h200_session21.sh" "$B" large
fi
if has cli16 && [ -f /tmp/sb16g ]; then
    W=/tmp/cli16
    rm -rf $W && mkdir -p $W
    "$B/daemon/vkscand" --config "" --socket $W/d.sock --state-dir $W/sd --engine gpu \
        --log-level notice >"$OUT/vkscand_d.log" 2>&1 &
    p1=$!
    "$B/daemon/vkscand" --config "" --socket $W/b.sock --state-dir $W/sb --engine gpu \
        --log-level notice --max-scan-bytes 20G --tenant-max-bytes 40G >"$OUT/vkscand_b.log" 2>&1 &
    p2=$!
    for f in d b; do
        for _ in $(seq 200); do grep -q "ready on" "$OUT/vkscand_$f.log" && break; sleep 0.1; done
    done
    for sock in d b; do
        for i in 1 2 3 4; do
            t0=$(date +%s.%N)
            out=$("$B/client/vkscan" --socket $W/$sock.sock scan -c --no-cache \
                -r build-data/dict-10.rules /tmp/sb16g 2>&1 | tr '\n' ' ')
            t1=$(date +%s.%N)
            echo "cli $([ $sock = d ] && echo "stream (default config)" || echo "block (20G)") run $i: $(echo "$t0 $t1" | awk '{printf "%.3f s, %.2f GB/s", $2 - $1, 17.179869184 / ($2 - $1)}'): $out"
        done
    done
    "$B/client/vkscan" --socket $W/d.sock status --json 2>/dev/null | tr ',' '\n' |
        grep -E '"stream\.(batch_writes|batch_bytes)"' | tr '\n' ' '
    echo
    for i in 1 2 3; do
        t0=$(date +%s.%N)
        out=$("$B/bench/hs_file" build-data/dict-10.rules /tmp/sb16g --threads 16 --iters 1 2>&1 | tail -n 1)
        t1=$(date +%s.%N)
        echo "hs_file run $i: $(echo "$t0 $t1" | awk '{printf "%.3f s wall", $2 - $1}'): $out"
    done
    kill $p1 $p2
    wait $p1 $p2 2>/dev/null
    grep -iE 'error|warn' "$OUT/vkscand_d.log" "$OUT/vkscand_b.log" | head -n 3
    rm -f /tmp/sb16g
fi
if has perf; then
    W=/tmp/sb-perf
    rm -rf $W && mkdir -p $W
    P="env LD_LIBRARY_PATH=$PWD/build-perf/lib:${LD_LIBRARY_PATH:-} build-perf/perf"
    $P record -e cpu-clock -F 1999 -o $W/perf.data -- "$B/daemon/vkscand" --config "" \
        --socket $W/s.sock --state-dir $W/state --engine gpu --log-level notice \
        --max-scan-bytes 20G --tenant-max-bytes 40G >"$OUT/perf_vkscand.log" 2>&1 &
    ppid=$!
    for _ in $(seq 200); do grep -q "ready on" "$OUT/perf_vkscand.log" && break; sleep 0.1; done
    timeout 200 "$B/bench/stream_bench" --socket $W/s.sock --threads 16 --iters 2 --no-hs \
        --only large --literals 10000 --large 16G --large-write "${PWRITE:-256M}" \
        --file /tmp/sb16g --window "${PWIN:-8}" 2>&1 | grep -E -A2 '^large:' | tail -n 1
    "$B/client/vkscan" --socket $W/s.sock status --json 2>/dev/null | tr ',' '\n' |
        grep -E '"stream\.batch_[a-z_]*_ns"|"stream\.batch_writes"' | tr '\n' ' '
    echo
    pkill -INT -f "vkscand --config  --socket $W/s.sock"
    wait $ppid 2>/dev/null
    for c in vks-gpu vks-upload; do
        echo "-- $c"
        $P report -i $W/perf.data --comm $c --no-children --sort symbol -g none 2>/dev/null |
            grep '%' | head -n 25
    done
    echo "-- by thread name"
    $P report -i $W/perf.data --no-children --sort comm -g none 2>/dev/null | grep '%' | head -n 12
    rm -f /tmp/sb16g
fi
if has flows; then
    bash "$D/h200_session14.sh" "$B" flows
fi
