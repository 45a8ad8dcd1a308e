#!/usr/bin/env bash
# Session 9's first call on the H200: the state of HEAD after session 8's
# unmeasured changes. In order, each step with its own time limit:
#   1. test_gpu and test_fault on the H200;
#   2. scan_bench, engine alone, 512 MiB as 64 KiB buffers, Hyperscan on
#      every core in the same run (two runs, so one slow set cannot take the
#      others' medians with it), and regex-500 without gating (the DFA shape);
#   3. scan_bench with one 1 GiB buffer;
#   4. cli_bench: one 1 GiB file through `vkscan scan -c --no-cache`
#      against bench/hs_file on every core;
#   5. rpc_bench, 64 clients, memfds scanned (not the result cache).
# Carry .gl, the release build BUILD, build-shared (a copy of ../shared/data)
# and build-data (pattern files and default.hay for cli_bench).
#
#   bench/h200_session9.sh BUILD [steps...]   steps: tests scan big cli rpc
set -u
B=${1:?usage: h200_session9.sh BUILD [steps...]}
shift
WHAT=${*:-tests scan big cli rpc}
OUT=${OUT:-/tmp/vks-out}
mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nproc | sed 's/^/cores /'
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }

if has tests; then
    for t in test_gpu test_fault; do
        timeout 90 "$B/tests/$t" >"$OUT/$t.txt" 2>&1
        echo "$t exit $?: $(grep -E 'Checks' "$OUT/$t.txt" | tail -n 1)"
        grep -E ':[EF]:' "$OUT/$t.txt" | head -n 5
    done
fi

scan() {
    local name=$1 limit=$2
    shift 2
    timeout "$limit" "$B/bench/scan_bench" --data build-shared "$@" >"$OUT/scan_$name.txt" 2>&1
    echo "scan_bench $name exit $?"
    grep -v '^ *iter' "$OUT/scan_$name.txt" | tail -n 30
}
if has scan; then
    scan a 90 --iters 5 --size 512M --only literals-1000,literals-10000,regex-500,gitleaks-keywords,dict-10,phrases-3k
    scan b 90 --iters 5 --size 512M --only regex-500-secrets,gitleaks-regex,binary-20k
    scan nogate 60 --iters 5 --size 512M --only regex-500,regex-500-secrets --gate-bits 4294967295
fi
if has big; then
    scan big 150 --iters 3 --size 1G --buffer 1073741824 --no-hs \
        --only literals-1000,literals-10000,regex-500,dict-10,gitleaks-keywords,gitleaks-regex,phrases-3k
fi
if has cli; then
    OUT=$OUT/cli WORK=/tmp/cli-work VKSCAN_ARGS=--no-cache timeout 200 bench/cli_bench.sh "$B" build-data \
        1024 3 auto >"$OUT/cli_bench.txt" 2>&1
    echo "cli_bench exit $?"
    cat "$OUT/cli_bench.txt"
fi
if has rpc; then
    rm -rf /tmp/vks && mkdir -p /tmp/vks
    "$B/daemon/vkscand" --config "" --socket /tmp/vks/s.sock --state-dir /tmp/vks/st \
        --max-frame 80M --log-level notice >"$OUT/vkscand.log" 2>&1 &
    d=$!
    for _ in $(seq 300); do grep -q "ready on" "$OUT/vkscand.log" && break; sleep 0.1; done
    timeout 60 "$B/bench/rpc_bench" --socket /tmp/vks/s.sock --seconds 3 --big-mib 64 \
        --clients 1,64 >"$OUT/rpc.txt" 2>&1
    echo "rpc_bench exit $?"
    "$B/client/vkscan" status --socket /tmp/vks/s.sock >"$OUT/status.txt" 2>&1
    kill -TERM "$d"
    wait "$d"
    cat "$OUT/rpc.txt"
    grep -iE "busy|batches" "$OUT/status.txt"
fi
