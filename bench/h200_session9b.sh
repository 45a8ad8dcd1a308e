#!/usr/bin/env bash
# Session 9's second H200 call: the GPU literal kernel (gpu/lit.c) against
# the DFA groups it replaces, the CLI path (one 1 GiB file through `vkscan
# scan` against hs_file), and stream_bench's H200 targets (issue 13).
# Carry .gl (with .gl/extra: libarchive13 for vkscan), BUILD, build-shared
# and build-data.
#
#   bench/h200_session9b.sh BUILD [steps...]   steps: tests lit cli stream
set -u
B=${1:?usage: h200_session9b.sh BUILD [steps...]}
shift
WHAT=${*:-tests lit cli stream}
OUT=${OUT:-/tmp/vks-out}
mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done
ldconfig
for f in .gl/extra/*.deb; do dpkg -x "$f" /opt/vks-extra >/dev/null 2>&1; done
export LD_LIBRARY_PATH=/opt/vks-extra/usr/lib/x86_64-linux-gnu
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
ldd "$B/client/vkscan" | grep "not found"
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
    grep -A12 -E '^workload' "$OUT/scan_$name.txt" | grep -v '^ *iter' | head -n 12
    grep -A9 -E '^median|^engines' "$OUT/scan_$name.txt" | head -n 24
}
if has lit; then
    L=dict-10,binary-20k,literals-10000,literals-1000,phrases-3k,gitleaks-keywords
    scan lit0 120 --iters 5 --size 512M --only $L
    scan litoff 120 --iters 5 --size 512M --only dict-10,binary-20k,literals-10000 --lit-kernel -1
    scan liton 90 --iters 5 --size 512M --only literals-1000,phrases-3k,gitleaks-keywords --lit-kernel 1
fi
if has cli; then
    OUT=$OUT/cli WORK=/tmp/cli-work VKSCAN_ARGS=--no-cache timeout 200 bench/cli_bench.sh "$B" build-data \
        1024 3 auto >"$OUT/cli_bench.txt" 2>&1
    echo "cli_bench exit $?"
    cat "$OUT/cli_bench.txt"
fi
if has stream; then
    timeout 150 "$B/bench/stream_bench" --threads 16 --iters 3 --streams 10000 --write 64K --rounds 4 \
        --literals 10000 --large 4G --large-write 16M --file /tmp/sb4g --data build-shared \
        >"$OUT/stream_lit.txt" 2>&1
    echo "stream_bench literals exit $?"
    grep -v '^ *iter' "$OUT/stream_lit.txt" | tail -n 25
    rm -f /tmp/sb4g
fi
