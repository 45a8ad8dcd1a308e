#!/usr/bin/env bash
# One call on the GPU machine (GPU.md): the GPU and fault suites, then
# scan_bench (engine alone, Hyperscan on every core in the same run), then
# cli_bench (one large file through `vkscan scan`), then rpc_bench against
# vkscand. BUILD is a release build carried with .gl; DATA holds the pattern
# files and haystacks for cli_bench (bench/cli_bench.sh). Results go to $OUT.
#
#   bench/h200_run.sh BUILD DATA [what...]   what: tests scan cli rpc (default all)
# SHARED: a copy of ../shared/data for scan_bench's real-data workloads.
set -u
BUILD=${1:?usage: h200_run.sh BUILD DATA [tests] [scan] [cli] [rpc]}
DATA=${2:?usage: h200_run.sh BUILD DATA [tests] [scan] [cli] [rpc]}
shift 2
WHAT=${*:-tests scan cli rpc}
OUT=${OUT:-/tmp/vks-out}
mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done
ldconfig
# Libraries the host may lack but whose neighbours it has in newer versions
# (libarchive and what only it needs): kept apart, found by the loader path.
if [ -d .gl/extra ]; then
    for f in .gl/extra/*.deb; do dpkg -x "$f" /opt/vks-extra >/dev/null 2>&1; done
    export LD_LIBRARY_PATH=/opt/vks-extra/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
nproc | sed 's/^/cores /'

has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }

if has tests; then
    for t in test_gpu test_fault; do
        [ -x "$BUILD/tests/$t" ] || continue
        timeout 300 "$BUILD/tests/$t" >"$OUT/$t.txt" 2>&1
        echo "$t exit $?: $(grep -E 'Checks' "$OUT/$t.txt" | tail -n 1)"
    done
fi
if has scan; then
    timeout 400 "$BUILD/bench/scan_bench" ${SCAN_ARGS:---iters 5} ${SHARED:+--data $SHARED} >"$OUT/scan_bench.txt" 2>&1
    echo "scan_bench exit $?"
    cat "$OUT/scan_bench.txt" | tail -n 40
fi
if has cli; then
    OUT=$OUT/cli WORK=/tmp/cli-work timeout 500 bench/cli_bench.sh "$BUILD" "$DATA" \
        ${CLI_MIB:-1024} ${CLI_ITERS:-5} ${CLI_ENGINE:-auto} >"$OUT/cli_bench.txt" 2>&1
    echo "cli_bench exit $?"
    cat "$OUT/cli_bench.txt"
fi
if has rpc; then
    rm -rf /tmp/vks && mkdir -p /tmp/vks
    "$BUILD/daemon/vkscand" --config "" --socket /tmp/vks/auto.sock --state-dir /tmp/vks/state \
        --max-frame 80M --log-level notice ${VKSCAND_ARGS:-} >"$OUT/vkscand.log" 2>&1 &
    daemon=$!
    for _ in $(seq 300); do grep -q "ready on" "$OUT/vkscand.log" && break; sleep 0.1; done
    timeout 200 "$BUILD/bench/rpc_bench" --socket /tmp/vks/auto.sock --seconds 4 --big-mib 64 \
        --clients ${RPC_CLIENTS:-1,8,64} >"$OUT/rpc.txt" 2>&1
    echo "rpc_bench exit $?"
    kill -TERM "$daemon"
    wait "$daemon"
    echo "vkscand exit $?"
    cat "$OUT/rpc.txt"
fi
