#!/usr/bin/env bash
# Session 23's H200 calls. Carry .gl (with .gl/extra), BUILD (a release
# build) and build-shared (a copy of ../shared/data).
#
#   bench/h200_session23.sh BUILD [steps...]
#   steps: gate   (regex-500-secrets, gitleaks-regex and regex-500 at the
#                  default gating and at each of $GATES (scan_bench options,
#                  `|`-separated), 1 GiB as 1 MiB buffers, medians of
#                  $ITERS, Hyperscan on 16 threads in the same process;
#                  then regex-500-secrets with --profile 1 per setting)
#          tests  (test_gpu and test_stream's daemon case: h200_session14.sh)
#          all    (every issue-9 workload at the default settings, 1 MiB
#                  buffers and one 1 GiB buffer)
#          restart (issue 10's warm restart: vkscand of the default
#                  configuration loads build-data/literals-10000.rules once
#                  (disk catalog cache and pipeline cache written), then is
#                  stopped and started $RESTARTS times: ms from its start to
#                  "ready on", then the wall of `vkscan scan -c` of a 4 KiB
#                  file, of a 64 MiB file, and of the 64 MiB file again
#                  (warm); carry build-data)
#          cli    (bench/cli_bench.sh on build-cli: one 1 GiB file through
#                  `vkscan scan -c --no-cache`, vkscand at its defaults, where
#                  a 1 GiB file is one request, and with each of $PIECES as
#                  max-scan-bytes, where the CLI streams it in pieces of that
#                  size, four in flight; hs_file on 16 threads beside it)
set -u
B=${1:?usage: h200_session23.sh BUILD [steps...]}
shift
WHAT=${*:-gate}
. "$(dirname "$0")/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
D=$(dirname "$0")
ITERS=${ITERS:-7}
# one scan_bench run; the whole output to $OUT/sb.txt, here the median row
# (kernel GB/s, e2e, Hyperscan, ratio), the hit check and the passes
SB() {
    "$B/bench/scan_bench" --size 1G --real-buffer 1M --iters "$ITERS" --threads 16 \
        --data build-shared "$@" 2>>"$OUT/scan_bench.err" >/tmp/sb1.txt
    cat /tmp/sb1.txt >>"$OUT/sb.txt"
    awk '/^workload /{t=1; next} t==1&&NF{print "  hits: " $0; t=0}
         /^median of iters/{m=1; next} m==1&&NF{print "  median: " $0; m=0}
         /^engines/{e=1; next} e==1&&NF{print "  passes: " $NF; e=0}
         /^profile ms/{p=1; next} p==1&&NF{print "  profile: " $0; p=0}
         /^telemetry/{k=1; next} k==1&&NF{print "  telemetry: " $0; k=0}' /tmp/sb1.txt
}
if has tests; then
    bash "$D/h200_session14.sh" "$B" tests
fi
if has gate; then
    IFS='|' read -r -a SETS <<<"${GATES:---gate-bits 21}"
    for w in ${GWORK:-regex-500-secrets gitleaks-regex regex-500}; do
        echo "== $w default"
        SB --buffer 1M --only "$w"
        for s in "${SETS[@]}"; do
            echo "== $w $s"
            # shellcheck disable=SC2086
            SB --buffer 1M --only "$w" $s
        done
    done
    for s in "" "${SETS[@]}"; do
        echo "== regex-500-secrets profile ${s:-default}"
        # shellcheck disable=SC2086
        ITERS=3 SB --buffer 1M --only regex-500-secrets --profile 1 $s
        echo "== regex-500-secrets 1G buffer ${s:-default}"
        # shellcheck disable=SC2086
        SB --buffer 1G --only regex-500-secrets $s
    done
fi
if has all; then
    for w in ${AWORK:-gitleaks-regex regex-500 regex-500-secrets dict-10 gitleaks-keywords binary-20k phrases-3k literals-1000 literals-10000}; do
        for buf in 1M 1G; do
            echo "== $w --buffer $buf"
            SB --buffer $buf --only "$w"
        done
    done
fi
if has restart; then
    W=/tmp/rs
    rm -rf $W && mkdir -p $W
    head -c 67108864 build-shared/rebar/haystacks/sherlock.txt >$W/f64 2>/dev/null
    while [ "$(stat -c %s $W/f64)" -lt 67108864 ]; do cat $W/f64 $W/f64 | head -c 67108864 >$W/t; mv $W/t $W/f64; done
    head -c 4096 $W/f64 >$W/f4k
    R=build-data/literals-10000.rules
    ms() { echo "$1 $2" | awk '{printf "%.1f", ($2 - $1) / 1e6}'; }
    start_d() {
        : >"$OUT/restart_d.log"
        t0=$(date +%s%N)
        "$B/daemon/vkscand" --config "" --socket $W/s.sock --state-dir $W/st \
            --log-level notice >>"$OUT/restart_d.log" 2>&1 &
        dpid=$!
        for _ in $(seq 5000); do grep -q "ready on" "$OUT/restart_d.log" && break; sleep 0.002; done
        tr=$(date +%s%N)
    }
    scan_ms() {
        local a b
        a=$(date +%s%N)
        timeout 30 "$B/client/vkscan" --socket $W/s.sock scan -c --no-cache -r $R "$1" >/dev/null 2>&1
        b=$(date +%s%N)
        ms "$a" "$b"
    }
    start_d
    echo "cold start (no cache): ready $(ms $t0 $tr) ms; 4K $(scan_ms $W/f4k) ms; 64M $(scan_ms $W/f64) ms; 64M $(scan_ms $W/f64) ms"
    kill -TERM $dpid; wait $dpid
    for i in $(seq "${RESTARTS:-5}"); do
        start_d
        echo "restart $i: ready $(ms $t0 $tr) ms; 4K $(scan_ms $W/f4k) ms; 64M first $(scan_ms $W/f64) ms; 64M warm $(scan_ms $W/f64) ms; $(scan_ms $W/f64) ms"
        kill -TERM $dpid; wait $dpid
    done
    ls -la $W/st | head
fi
if has cli; then
    echo "== cli: vkscand defaults"
    OUT=$OUT/cli-default VKSCAN_ARGS=--no-cache bash "$D/cli_bench.sh" "$B" build-cli 1024 5
    for p in ${PIECES:-256M}; do
        echo "== cli: max-scan-bytes $p"
        OUT=$OUT/cli-$p VKSCAND_ARGS="--max-scan-bytes $p" VKSCAN_ARGS=--no-cache \
            bash "$D/cli_bench.sh" "$B" build-cli 1024 5
    done
fi
