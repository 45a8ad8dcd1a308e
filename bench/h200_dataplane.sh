#!/usr/bin/env bash
# Issue 10 ("one pass over host memory"): the daemon's data path from the
# client's pages to the device, measured through the service.
#
#   bench/h200_dataplane.sh BUILD [steps...]      steps: rpc cli (default both)
#
#   rpc: vkscand with its defaults (engine auto; --max-frame 80M so a 64 MiB
#        inline buffer would fit a frame) under rpc_bench, 64 MiB scans,
#        1 and 64 clients, inline (libvkscan moves it to a memfd) and memfd,
#        result cache bypassed; then `vkscan status`. Once per FD_MODES
#        (default "auto pread map populate auto-16", below).
#   cli: bench/cli_bench.sh, one 1 GiB file through `vkscan scan -c
#        --no-cache` (the file is read by the daemon, not the cache).
#
# On the H200: carry .gl, BUILD (a release build) and build-data (pattern
# files and default.hay, docs/PERFORMANCE.md "The path users take").
# Elsewhere (the development machine, lavapipe): set GPU=0 to skip the
# driver set-up, and VKSCAND_ARGS="--engine gpu" so the scans run on the
# Vulkan path (auto scans on the CPU engine without a GPU). RPC_ARGS
# replaces rpc_bench's defaults (--seconds 3 --clients 1,64). Results go to
# $OUT (default /tmp/vks-out).
set -u
B=${1:?usage: h200_dataplane.sh BUILD [steps...]}
shift
WHAT=${*:-rpc cli}
OUT=${OUT:-/tmp/vks-out}
GPU=${GPU:-1}
mkdir -p "$OUT"
if [ "$GPU" = 1 ]; then
    for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done
    ldconfig
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
fi
[ -d "$B/lib" ] && export LD_LIBRARY_PATH=$PWD/$B/lib
nproc | sed 's/^/cores /'
git rev-parse --short HEAD 2>/dev/null | sed 's/^/commit /'
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }

# One vkscand per way of taking descriptor buffers ($VKSCAND_FD_UPLOAD,
# docs/daemon.md): auto (the default: sealed memfds mapped at load and
# copied at upload, other files read by the upload threads straight into
# staging), pread (every file read at upload), map (the way before: sealed
# memfds mapped, other files read into memory at load), populate (map, with
# MAP_POPULATE); MODE-N runs MODE with N upload threads
# ($VKSCAND_UPLOAD_THREADS; the default is one per core, at most 8).
if has rpc; then
    for mode in ${FD_MODES:-auto pread map populate auto-16}; do
        rm -rf /tmp/vks-dp && mkdir -p /tmp/vks-dp
        threads=${mode#*-}
        [ "$threads" = "$mode" ] && threads=
        # shellcheck disable=SC2086
        VKSCAND_UPLOAD_THREADS=$threads VKSCAND_FD_UPLOAD=${mode%-*} "$B/daemon/vkscand" --config "" --socket /tmp/vks-dp/s.sock \
            --state-dir /tmp/vks-dp/st --max-frame 80M --log-level notice ${VKSCAND_ARGS:-} \
            >"$OUT/vkscand-$mode.log" 2>&1 &
        d=$!
        for _ in $(seq 600); do grep -q "ready on" "$OUT/vkscand-$mode.log" && break; sleep 0.1; done
        # shellcheck disable=SC2086
        timeout 120 "$B/bench/rpc_bench" --socket /tmp/vks-dp/s.sock --big-mib 64 \
            --workloads large ${RPC_ARGS:---seconds 3 --clients 1,64} >"$OUT/rpc-$mode.txt" 2>&1
        echo "fd $mode: rpc_bench exit $?"
        "$B/client/vkscan" status --socket /tmp/vks-dp/s.sock >"$OUT/status-$mode.txt" 2>&1
        kill -TERM "$d"
        wait "$d"
        echo "fd $mode: vkscand exit $?"
        sed "s/^/$mode /" "$OUT/rpc-$mode.txt"
        grep -iE "busy|batches" "$OUT/status-$mode.txt"
    done
fi
if has cli; then
    OUT=$OUT/cli WORK=/tmp/cli-work VKSCAN_ARGS=--no-cache timeout 200 bench/cli_bench.sh "$B" \
        build-data 1024 3 auto >"$OUT/cli_bench.txt" 2>&1
    echo "cli_bench exit $?"
    cat "$OUT/cli_bench.txt"
fi
