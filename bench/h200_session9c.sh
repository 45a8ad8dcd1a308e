#!/usr/bin/env bash
# Session 9's last H200 call. fuzz_rules on 14 of the 16 cores for FUZZ_S
# seconds (issue 8: 10^7 executions of the rules target), and meanwhile
# what the fuzzer's load does not decide: test_gpu and one 256 MiB file
# of gitleaks-regex through the daemon with its telemetry;
# then, with the cores free again, rpc_bench through the data path.
# Carry .gl, BUILD (release), FUZZ (the clang fuzz build), build-shared
# and build-data.
#
#   bench/h200_session9c.sh BUILD FUZZ
set -u
B=${1:?usage: h200_session9c.sh BUILD FUZZ}
F=${2:?usage: h200_session9c.sh BUILD FUZZ}
OUT=${OUT:-/tmp/vks-out}
mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done
ldconfig
for f in .gl/extra/*.deb; do dpkg -x "$f" /opt/vks-extra >/dev/null 2>&1; done
export LD_LIBRARY_PATH=/opt/vks-extra/usr/lib/x86_64-linux-gnu
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json

OUT=$OUT/fuzz BIN=$F/tests/fuzz_rules bash bench/fuzz_h200.sh "${FUZZ_S:-400}" 14 >"$OUT/fuzz.txt" 2>&1 &
fz=$!

timeout 90 "$B/tests/test_gpu" >"$OUT/test_gpu.txt" 2>&1
echo "test_gpu exit $?: $(grep -E 'Checks' "$OUT/test_gpu.txt" | tail -n 1)"
grep -E ':[EF]:' "$OUT/test_gpu.txt" | head -n 5
# gitleaks-regex, one file through the daemon (cli_bench did not finish it)
rm -rf /tmp/gl && mkdir -p /tmp/gl
for _ in $(seq 450); do cat build-data/default.hay; done | head -c 256M >/tmp/gl/f.txt
"$B/daemon/vkscand" --config "" --socket /tmp/gl/s.sock --state-dir /tmp/gl/st --log-level notice \
    >"$OUT/gl-vkscand.log" 2>&1 &
d=$!
for _ in $(seq 300); do grep -q "ready on" "$OUT/gl-vkscand.log" && break; sleep 0.1; done
for i in 1 2; do
    s=$(date +%s.%N)
    VKSCAN_TELEMETRY=1 timeout 60 "$B/client/vkscan" --socket /tmp/gl/s.sock scan -c --no-cache \
        -r build-data/gitleaks-regex.rules /tmp/gl/f.txt >"$OUT/gl$i.txt" 2>&1
    echo "gitleaks-regex 256 MiB via vkscan, run $i: exit $? in $(awk -v a="$s" -v b="$(date +%s.%N)" 'BEGIN {print b - a}') s"
    tr ' ' '\n' <"$OUT/gl$i.txt" | grep -E '^(engine|cpu_segments|plan_ns|upload_ns|run_ns|kernel_launches|items_processed|total_ns|batch_buffers)=' | tr '\n' ' '
    echo
done
kill -TERM $d
wait $d

wait $fz
tail -n 3 "$OUT/fuzz.txt"
ls "$OUT/fuzz" | grep -c crash- | sed 's/^/crash files: /'
rm -rf "$OUT/fuzz/corpus-rules"

FD_MODES="auto pread" RPC_ARGS="--seconds 3 --clients 1,64" timeout 120 bash bench/h200_dataplane.sh "$B" rpc \
    >"$OUT/dataplane.txt" 2>&1
echo "dataplane exit $?"
grep -E "rpc_bench exit|large" "$OUT/dataplane.txt" | head -n 12
