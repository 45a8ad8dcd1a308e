#!/usr/bin/env bash
# multi_gpu: vkscand on one GPU against all GPUs of the host, in one run.
# For each device list it starts vkscand (--engine gpu --devices LIST), runs
# rpc_bench (inline and memfd, 4 KiB and 64 MiB scans at the client counts
# given) and prints `vkscan status` (per-engine batches, busy share and the
# catalog uploads per device). BUILD is a release build carried with .gl.
#
#   bench/multi_gpu.sh BUILD [SECONDS] [CLIENTS] [LISTS]
#
# LISTS: space-separated device lists (default "0 all"). Results under $OUT.
set -u
BUILD=${1:?usage: multi_gpu.sh BUILD [SECONDS] [CLIENTS] [LISTS]}
SECONDS_EACH=${2:-4}
CLIENTS=${3:-1,8,64}
LISTS=${4:-0 all}
OUT=${OUT:-/tmp/multi-gpu}
mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done
ldconfig
if [ -d .gl/extra ]; then
    for f in .gl/extra/*.deb; do dpkg -x "$f" /opt/vks-extra >/dev/null 2>&1; done
    export LD_LIBRARY_PATH=/opt/vks-extra/usr/lib/x86_64-linux-gnu
fi
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader

for list in $LISTS; do
    tag=devices-${list//,/_}
    dir=/tmp/vks-$tag
    rm -rf "$dir" && mkdir -p "$dir"
    "$BUILD/daemon/vkscand" --config "" --socket "$dir/s.sock" --state-dir "$dir/state" \
        --max-frame 80M --engine gpu --devices "$list" --log-level notice >"$OUT/$tag.log" 2>&1 &
    daemon=$!
    for _ in $(seq 600); do grep -q "ready on" "$OUT/$tag.log" && break; sleep 0.1; done
    grep -E "engine [0-9]+:|ready on" "$OUT/$tag.log"
    echo "== $tag: rpc_bench --seconds $SECONDS_EACH --big-mib 64 --clients $CLIENTS"
    timeout 300 "$BUILD/bench/rpc_bench" --socket "$dir/s.sock" --seconds "$SECONDS_EACH" \
        --big-mib 64 --clients "$CLIENTS" >"$OUT/$tag.rpc" 2>&1
    cat "$OUT/$tag.rpc"
    "$BUILD/client/vkscan" --socket "$dir/s.sock" status >"$OUT/$tag.status" 2>&1
    "$BUILD/client/vkscan" --socket "$dir/s.sock" status --json >"$OUT/$tag.status.json" 2>&1
    grep -iE "engine|resident|upload" "$OUT/$tag.status"
    kill -TERM "$daemon"
    wait "$daemon"
done
