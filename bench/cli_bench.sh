#!/usr/bin/env bash
# cli_bench: the path users take. One large file in the page cache, scanned
# by `vkscan scan -c` through a running vkscand (wall time from the command's
# start to its exit), against bench/hs_file (Hyperscan, N threads, the file
# mmap'd and split) over the same file, in the same run.
#
#   bench/cli_bench.sh BUILD DATA [SIZE_MIB] [ITERS] [ENGINE]
#
# BUILD: a release build directory (vkscand, vkscan, hs_file). DATA: a folder
# with pattern files *.rules and, for each, a haystack NAME.hay (or the one
# file default.hay) that is repeated to SIZE_MIB (default 1024) MiB. ITERS
# (default 5) runs of each; medians are printed. ENGINE: vkscand's --engine
# (default auto). VKSCAND_ARGS: more vkscand options (--max-scan-bytes 256M
# makes the CLI stream larger files in pieces). VKSCAN_ARGS: more `vkscan scan` options; --no-cache
# measures scanning, since vkscand answers an unchanged file's rescan from
# its result cache. STATUS=1 prints the daemon's cpu.* and stream.scan_*
# counters at the end. Output: one line per rule set, and the raw times under
# $OUT (default /tmp/cli-bench).
set -u
BUILD=${1:?usage: cli_bench.sh BUILD DATA [SIZE_MIB] [ITERS] [ENGINE]}
DATA=${2:?usage: cli_bench.sh BUILD DATA [SIZE_MIB] [ITERS] [ENGINE]}
SIZE_MIB=${3:-1024}
ITERS=${4:-5}
ENGINE=${5:-auto}
THREADS=${HS_THREADS:-$(nproc)}
OUT=${OUT:-/tmp/cli-bench}
WORK=${WORK:-/tmp/cli-bench-work}
mkdir -p "$OUT" "$WORK"

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

now() { date +%s.%N; }

# make_file HAY DEST: repeats HAY into DEST up to SIZE_MIB MiB.
make_file() {
    local hay=$1 dest=$2 want=$((SIZE_MIB * 1048576))
    [ -f "$dest" ] && [ "$(stat -c %s "$dest")" -eq "$want" ] && return 0
    local reps=$(((want + $(stat -c %s "$hay") - 1) / $(stat -c %s "$hay")))
    for _ in $(seq "$reps"); do cat "$hay"; done | head -c "$want" >"$dest"
}

sock=$WORK/vkscand.sock
rm -rf "$WORK/state"
# shellcheck disable=SC2086
"$BUILD/daemon/vkscand" --config "" --socket "$sock" --state-dir "$WORK/state" \
    --engine "$ENGINE" --log-level notice ${VKSCAND_ARGS:-} >"$OUT/vkscand.log" 2>&1 &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null' EXIT
for _ in $(seq 600); do grep -q "ready on" "$OUT/vkscand.log" && break; sleep 0.1; done

# vkscan_s: median wall time of `vkscan scan -c` (warm daemon, warm cache).
# hs_scan_s: median Hyperscan scan time (compiled, file mapped); hs_wall_s:
# median wall time of the whole hs_file process (compile, map, one scan).
# x_hs: hs_scan_s / vkscan_s (above 1: vkscan is faster). hs_matches: what the
# split Hyperscan scan counted (chunks overlap, so a few may count twice);
# vk_matches: the sum of `vkscan scan -c`'s counts (exact).
printf '%-28s %8s %10s %10s %10s %10s %8s %10s %10s\n' set MiB vkscan_s vk_GB/s hs_scan_s hs_wall_s \
    x_hs hs_matches
for rules in "$DATA"/*.rules; do
    name=$(basename "$rules" .rules)
    hay=$DATA/$name.hay
    [ -f "$hay" ] || hay=$DATA/default.hay
    file=$WORK/$(basename "$hay" .hay).big
    make_file "$hay" "$file"
    cat "$file" >/dev/null # page cache warm
    # The first scan compiles (or reads from the disk cache) and warms the
    # pipelines: untimed, as a user's second run.
    "$BUILD/client/vkscan" --socket "$sock" scan -c ${VKSCAN_ARGS:-} -r "$rules" "$file" >"$OUT/$name.first" 2>&1
    if [ $? -gt 1 ]; then
        echo "$name: vkscan scan failed: $(grep -v warning "$OUT/$name.first" | head -n 2)"
        continue
    fi
    : >"$OUT/$name.vk"
    for _ in $(seq "$ITERS"); do
        t0=$(now)
        "$BUILD/client/vkscan" --socket "$sock" scan -c ${VKSCAN_ARGS:-} -r "$rules" "$file" >"$OUT/$name.count" 2>&1
        t1=$(now)
        awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.6f\n", b - a}' >>"$OUT/$name.vk"
    done
    vk=$(median <"$OUT/$name.vk")
    : >"$OUT/$name.hsw"
    for _ in $(seq "$ITERS"); do
        t0=$(now)
        "$BUILD/bench/hs_file" "$rules" "$file" --threads "$THREADS" --iters 1 >"$OUT/$name.hs" 2>&1
        t1=$(now)
        awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.6f\n", b - a}' >>"$OUT/$name.hsw"
    done
    hsw=$(median <"$OUT/$name.hsw")
    hs=$("$BUILD/bench/hs_file" "$rules" "$file" --threads "$THREADS" --iters "$ITERS")
    echo "$hs" >"$OUT/$name.hs"
    hs_scan=$(echo "$hs" | sed -n 's/.*scan_s_median \([0-9.]*\).*/\1/p')
    matches=$(echo "$hs" | sed -n 's/.*matches \([0-9]*\).*/\1/p')
    vk_matches=$(awk -F: '{s += $NF} END {print s + 0}' "$OUT/$name.count")
    vk_gbps=$(awk -v m="$SIZE_MIB" -v t="$vk" 'BEGIN {print m * 1048576 / t / 1e9}')
    speedup=$(awk -v h="$hs_scan" -v t="$vk" 'BEGIN {print h / t}')
    printf '%-28s %8d %10.3f %10.2f %10.4f %10.3f %8.2f %10s %10s\n' "$name" "$SIZE_MIB" "$vk" \
        "$vk_gbps" "$hs_scan" "$hsw" "$speedup" "$matches" "$vk_matches"
done
# STATUS=1: the daemon's cpu.* and stream.scan_* counters at the end
if [ "${STATUS:-0}" = 1 ]; then
    "$BUILD/client/vkscan" --socket "$sock" status --json | tr ',{}' '\n\n\n' |
        grep -E '"(cpu\.|stream\.scan_)' | tr '\n' ' '
    echo
fi
