#!/usr/bin/env bash
# One-call check on the GPU machine (docs/PERFORMANCE.md, "Final check"):
# the GPU test suite, then vkscand with its default engine (auto: small
# batches on the CPU scanner, the rest on the GPU) under rpc_bench, then the
# engine alone on two synthetic sets. BUILD is a release build dir carried
# with .gl (GPU.md); results go to $OUT.
set -u
BUILD=${1:-build-final}
OUT=${OUT:-/tmp/vks-out}
mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export LD_LIBRARY_PATH=$PWD/$BUILD/lib
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

"$BUILD/tests/test_gpu" >"$OUT/test_gpu.txt" 2>&1
echo "test_gpu exit $?: $(tail -n 1 "$OUT/test_gpu.txt")"

rm -rf /tmp/vks && mkdir -p /tmp/vks
"$BUILD/daemon/vkscand" --config "" --socket /tmp/vks/auto.sock --state-dir /tmp/vks/state \
    --max-frame 80M --log-level notice >"$OUT/vkscand.log" 2>&1 &
daemon=$!
for _ in $(seq 300); do grep -q "ready on" "$OUT/vkscand.log" && break; sleep 0.1; done
"$BUILD/bench/rpc_bench" --socket /tmp/vks/auto.sock --seconds 4 --big-mib 64 \
    --clients 1,8,64 >"$OUT/rpc_auto.txt" 2>&1
echo "rpc_bench exit $?"
kill -TERM "$daemon"
wait "$daemon"
echo "vkscand exit $?"

"$BUILD/bench/scan_bench" --only literals-1000,regex-500 --no-hs --iters 3 \
    >"$OUT/scan_bench.txt" 2>&1
echo "scan_bench exit $?"
cat "$OUT/rpc_auto.txt" "$OUT/scan_bench.txt"
