#!/usr/bin/env bash
# Session 10's H200 call: the GPU tests on the real device, one 1 GiB
# buffer against 1 MiB buffers in scan_bench (speculative segments of
# unbounded DFA groups, capped forward confirmations), and the CLI path
# (one 1 GiB file of English text through `vkscan scan` against hs_file).
# Carry .gl (with .gl/extra: libarchive13 for vkscan), BUILD, build-shared
# and build-data (gitleaks-regex, gitleaks-keywords, dict-10 rules and
# sherlock.txt as default.hay).
#
#   bench/h200_session10.sh BUILD [steps...]   steps: tests scan factor cli tel
#
# tel: each rule set of build-data once more through `vkscan scan -c
# --no-cache` with VKSCAN_TELEMETRY=1 (where a scan's time goes), after cli.
set -u
B=${1:?usage: h200_session10.sh BUILD [steps...]}
shift
WHAT=${*:-tests scan cli}
OUT=${OUT:-/tmp/vks-out}
mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done
ldconfig
for f in .gl/extra/*.deb; do dpkg -x "$f" /opt/vks-extra >/dev/null 2>&1; done
export LD_LIBRARY_PATH=/opt/vks-extra/usr/lib/x86_64-linux-gnu
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
ldd "$B/client/vkscan" "$B/daemon/vkscand" | grep "not found"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }

if has tests; then
    for t in test_gpu test_fault; do
        timeout 120 "$B/tests/$t" >"$OUT/$t.txt" 2>&1
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
}
if has scan; then
    S=${SCAN_ONLY:-gitleaks-regex,regex-500,gitleaks-keywords}
    scan buf1m 150 --iters 5 --size 1G --buffer 1048576 --only "$S"
    scan buf1g 150 --iters 5 --size 1G --buffer 1073741824 --only "$S"
fi
if has factor; then
    # the factor pass on the device against the host walk (session 11)
    S=${FACTOR_ONLY:-gitleaks-regex,regex-500,regex-500-secrets}
    for fp in -1 1; do
        scan factor$fp-1m 200 --iters 5 --size 1G --buffer 1048576 --only "$S" --factor-pass $fp
        scan factor$fp-1g 200 --iters 5 --size 1G --buffer 1073741824 --only "$S" --factor-pass $fp
        grep -A8 '^telemetry' "$OUT/scan_factor$fp-1g.txt"
    done
fi
if has cli; then
    OUT=$OUT/cli WORK=/tmp/cli-work VKSCAN_ARGS=--no-cache timeout ${CLI_LIMIT:-240} \
        bench/cli_bench.sh "$B" build-data 1024 3 auto >"$OUT/cli_bench.txt" 2>&1
    echo "cli_bench exit $?"
    cat "$OUT/cli_bench.txt"
    grep -iE 'timeout|did not finish|error' "$OUT/cli/vkscand.log" | head -n 5
fi
if has tel; then
    W=/tmp/cli-work
    "$B/daemon/vkscand" --config "" --socket $W/t.sock --state-dir $W/tstate --log-level notice \
        >"$OUT/tel_vkscand.log" 2>&1 &
    dpid=$!
    for _ in $(seq 100); do grep -q "ready on" "$OUT/tel_vkscand.log" && break; sleep 0.1; done
    for r in build-data/*.rules; do
        n=$(basename "$r" .rules)
        "$B/client/vkscan" --socket $W/t.sock scan -c --no-cache -r "$r" $W/default.big >/dev/null 2>&1
        for k in $(seq ${TEL_RUNS:-1}); do
            t0=$(date +%s.%N)
            VKSCAN_TELEMETRY=1 "$B/client/vkscan" --socket $W/t.sock scan -c --no-cache -r "$r" \
                $W/default.big 2>"$OUT/tel_$n.txt" >/dev/null
            t1=$(date +%s.%N)
            echo "tel $n: $(awk -v a=$t0 -v b=$t1 'BEGIN {printf "%.3f s", b - a}')"
            tr ' ' '\n' <"$OUT/tel_$n.txt" | grep -E "^(client_rpc_ns|connect_ns|rules_ns|finish_ns|queue_ns|factor_ns|fd_read_ns|plan_ns|upload_ns|run_ns|readback_ns|scan_ns|total_ns|wall_ns|spec_fixes|confirm_host|kernel_launches|device_ns|finalize_ns|hits_raw|hit_reruns|hits)=" | tr '\n' ' '
            echo
        done
    done
    kill $dpid
fi
