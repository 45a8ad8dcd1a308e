#!/usr/bin/env bash
# Where the host time of the gated sets goes on a GPU host: scan_bench's
# telemetry (the factor pass's plan, upload, wait, read and sort), then
# scan_bench under perf (no Hyperscan in the process), the flat profile by
# thread and by symbol. Carry .gl, BUILD, build-perf (/usr/bin/perf and the
# libraries ldd names, in build-perf/lib) and build-probe-SET for each set.
#   bench/h200_profile.sh BUILD [SET:SIZE[:BUFFER]...]
set -u
B=${1:?usage: h200_profile.sh BUILD [SET:SIZE[:BUFFER]...]}
shift
SETS=${*:-gitleaks-regex:1G:1G leads:256M wordy-300:256M}
D=$(dirname "$0")
. "$D/h200_env.sh"
export LD_LIBRARY_PATH=$PWD/build-perf/lib:$LD_LIBRARY_PATH
S=$OUT/summary.txt
for spec in $SETS; do
    IFS=: read -r set size buf <<<"$spec"
    args=(--data "build-probe-$set" --only gitleaks-regex --size "$size" --threads 16)
    [ -n "$buf" ] && args+=(--buffer "$buf")
    echo "== $set $size ${buf:+one buffer} ($(date +%T))" | tee -a "$S"
    timeout 90 "$B/bench/scan_bench" "${args[@]}" --iters 5 2>&1 | grep -A1 -E "^(workload|telemetry|factor)" |
        grep -v "^--" | tee -a "$S"
    timeout 120 build-perf/perf record -F 1999 -o "$OUT/$set.data" -- \
        "$B/bench/scan_bench" "${args[@]}" --iters 5 --no-hs >/dev/null 2>&1
    timeout 60 build-perf/perf report -i "$OUT/$set.data" --no-children --sort comm --stdio 2>/dev/null |
        grep -v "^#" | grep -v "^$" | head -12 | tee -a "$S"
    timeout 60 build-perf/perf report -i "$OUT/$set.data" --no-children --sort comm,sym --stdio 2>/dev/null |
        grep -v "^#" | grep -v "^$" | head -45 | tee -a "$S"
    rm -f "$OUT/$set.data"
done
