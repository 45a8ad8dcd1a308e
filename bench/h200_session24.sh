#!/usr/bin/env bash
# Session 24's H200 calls. Carry .gl (with .gl/extra), BUILD (a release
# build with tests and benches), build-shared (a copy of ../shared/data),
# build-data and build-cli (as for h200_session23.sh).
#
#   bench/h200_session24.sh BUILD [steps...]
#   steps: tests   (test_gpu and test_stream's daemon case: h200_session14.sh)
#          restart (bench/h200_restart.sh: ready, first 4 KiB / 64 MiB after
#                   a restart, with the preload and warm-up and without)
#          confirm (bench/confirm_bench: forward confirmations alive past
#                   the GPU's cap on adversarial data, finished on the host)
#          scli    (the CLI's stream path: one 1 GiB file through
#                   `vkscan scan -c --no-cache` with vkscand at max-scan-bytes
#                   $PIECE (default 256M), so the file streams in pieces:
#                   count mode, gitleaks-regex's gated walks; then the same
#                   file as one request; hs_file beside it; $ITERS runs)
#          rpc     (4 KiB scans through vkscand at 1, 8, 64 and 256 clients,
#                   inline and by memfd, with replies written on the engine
#                   thread (VKSCAND_ENGINE_REPLIES=1) and by the loop (the
#                   default); the loop thread's CPU ticks per run; $RPC_MODES
#                   picks among `engine loop`, $VKSCAND_ARGS adds flags)
# Every step's output goes to stdout; run it with a timeout and a file.
set -u
B=${1:?usage: h200_session24.sh BUILD [steps...]}
shift
WHAT=${*:-tests}
D=$(dirname "$0")
. "$D/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }

if has tests; then
    bash "$D/h200_session14.sh" "$B" tests
fi
if has restart; then
    RESTARTS=${RESTARTS:-4} bash "$D/h200_restart.sh" "$B"
fi
if has confirm; then
    for t in 16 1; do
        echo "== confirm_bench mixed 16 x 64 MiB, --threads $t"
        "$B/bench/confirm_bench" --shape all --layout mixed --size 64M --buffers 16 --gpu 1 \
            --cap 0 --reps 3 --check 1 --threads $t
    done
    echo "== confirm_bench pem one 1 GiB"
    "$B/bench/confirm_bench" --shape pem --layout one --size 1G --buffers 1 --gpu 1 --cap 0 --reps 2
fi
if has scli; then
    for args in "--max-scan-bytes ${PIECE:-256M}" ""; do
        echo "== cli_bench, vkscand ${args:-defaults}"
        OUT=$OUT/cli VKSCAN_ARGS=--no-cache VKSCAND_ARGS="$args" \
            bash "$D/cli_bench.sh" "$B" build-cli 1024 "${ITERS:-3}"
    done
fi
if has rpc; then
    for m in ${RPC_MODES:-engine loop}; do
        rm -rf /tmp/v && mkdir -p /tmp/v
        # session 24's binaries read VKSCAND_ENGINE_REPLIES; since session 25
        # the option is engine-replies (default yes)
        if [ $m = loop ]; then unset VKSCAND_ENGINE_REPLIES; else export VKSCAND_ENGINE_REPLIES=1; fi
        er=""
        "$B/daemon/vkscand" --help 2>&1 | grep -q engine-replies &&
            er="--engine-replies $([ $m = loop ] && echo no || echo yes)"
        # shellcheck disable=SC2086
        "$B/daemon/vkscand" --config "" --socket /tmp/v/s.sock --state-dir /tmp/v/st \
            --max-frame 80M --log-level notice $er ${VKSCAND_ARGS:-} >"$OUT/vkscand-$m.log" 2>&1 &
        d=$!
        for _ in $(seq 600); do grep -q "ready on" "$OUT/vkscand-$m.log" && break; sleep 0.1; done
        for i in inline memfd; do
            for c in 1 8 64 256; do
                t0=$(awk '{print $14+$15}' /proc/$d/task/$d/stat)
                timeout 60 "$B/bench/rpc_bench" --socket /tmp/v/s.sock --seconds 2 --clients $c \
                    --workloads small --inputs $i --big-mib 1 | grep -E '^4KiB' | sed "s/^/$m $i /"
                t1=$(awk '{print $14+$15}' /proc/$d/task/$d/stat)
                echo "$m $i $c loop_cpu_ticks $((t1 - t0))"
            done
        done
        "$B/client/vkscan" status --socket /tmp/v/s.sock | grep -iE 'served|busy'
        kill -TERM $d
        wait $d
        echo "$m vkscand exit $?"
    done
    unset VKSCAND_ENGINE_REPLIES
fi
