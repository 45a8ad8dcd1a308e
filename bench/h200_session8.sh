#!/usr/bin/env bash
# Session 8's one call on the H200 (device time was short: one call of about
# three minutes). In order, each with its own time limit:
#   1. test_gpu on the H200 (the new forward-confirmation kernel, pipelining);
#   2. scan_bench, engine alone, Hyperscan on every core in the same run;
#   3. rpc_bench against vkscand, 64 clients, --inflight-batches 1 (the old
#      one-batch-at-a-time engine) and 2 (pipelined).
# Carry .gl, the release build BUILD and build-shared (a copy of
# ../shared/data: dict-10 needs its en-sampled.txt haystack). Results go
# to $OUT.
#
#   bench/h200_session8.sh BUILD
set -u
B=${1:?usage: h200_session8.sh BUILD}
OUT=${OUT:-/tmp/vks-out}
mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nproc | sed 's/^/cores /'

timeout 40 "$B/tests/test_gpu" >"$OUT/test_gpu.txt" 2>&1
echo "test_gpu exit $?: $(grep -E 'Checks' "$OUT/test_gpu.txt" | tail -n 1)"

# Two runs, so that a slow set cannot take the others' medians with it.
scan() {
    timeout 60 "$B/bench/scan_bench" --iters 5 --size ${SCAN_SIZE:-512M} --data ${SHARED:-build-shared} \
        --only "$1" >"$OUT/scan_bench_$2.txt" 2>&1
    echo "scan_bench $2 exit $?"
    grep -v '^ *iter' "$OUT/scan_bench_$2.txt" | tail -n 40
}
scan literals-1000,regex-500,gitleaks-keywords,dict-10,phrases-3k a
scan regex-500-secrets,gitleaks-regex,binary-20k b

for n in 1 2; do
    rm -rf /tmp/vks && mkdir -p /tmp/vks
    "$B/daemon/vkscand" --config "" --socket /tmp/vks/s.sock --state-dir /tmp/vks/st \
        --max-frame 80M --log-level notice --inflight-batches $n >"$OUT/vkscand$n.log" 2>&1 &
    d=$!
    for _ in $(seq 300); do grep -q "ready on" "$OUT/vkscand$n.log" && break; sleep 0.1; done
    timeout 40 "$B/bench/rpc_bench" --socket /tmp/vks/s.sock --seconds 3 --big-mib 64 \
        --clients 64 >"$OUT/rpc$n.txt" 2>&1
    echo "rpc_bench inflight $n exit $?"
    "$B/client/vkscan" status --socket /tmp/vks/s.sock >"$OUT/status$n.txt" 2>&1
    kill -TERM "$d"
    wait "$d"
    cat "$OUT/rpc$n.txt"
    grep -iE "busy|batches" "$OUT/status$n.txt"
done
