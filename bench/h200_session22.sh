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
if has flows; then
    bash "$D/h200_session14.sh" "$B" flows
fi
