#!/usr/bin/env bash
# The per-command cost of `vkscan scan -c`: one small file (the first 100 KB
# of a haystack) scanned by a fresh vkscan process, as a hook or a script
# calling vkscan per file does; wall time from fork to exit, medians of N
# (with the quartiles). Starts its own vkscand on the CPU engine (small
# scans run there under engine auto), so it runs on any machine.
#
#   bench/cli_small.sh BUILD HAYSTACK N RULES...
#
# Example: bench/cli_small.sh build-rel build-data/default.hay 25 build-data/*.rules
set -u
B=${1:?usage: cli_small.sh BUILD HAYSTACK N RULES...}
HAY=${2:?haystack}
N=${3:?iterations}
shift 3
W=$(mktemp -d /tmp/cli-small.XXXXXX)
trap 'kill "$d" 2>/dev/null; wait "$d" 2>/dev/null; rm -rf "$W"' EXIT
head -c 100000 "$HAY" >"$W/small"
"$B/daemon/vkscand" --config "" --socket "$W/s.sock" --state-dir "$W/state" --engine cpu \
    --log-level notice >"$W/log" 2>&1 &
d=$!
for _ in $(seq 100); do grep -q "ready on" "$W/log" && break; sleep 0.1; done
printf '%-24s %10s %10s %10s\n' set median_ms p25_ms p75_ms
for r in "$@"; do
    "$B/client/vkscan" --socket "$W/s.sock" scan -c -r "$r" "$W/small" >/dev/null 2>&1 # compile once
    for _ in $(seq "$N"); do
        s=$(date +%s%N)
        "$B/client/vkscan" --socket "$W/s.sock" scan -c --no-cache -r "$r" "$W/small" >/dev/null 2>&1
        e=$(date +%s%N)
        echo $(((e - s) / 1000))
    done | sort -n | awk -v n="$(basename "$r" .rules)" '{a[NR] = $1}
        END {printf "%-24s %10.2f %10.2f %10.2f\n", n, a[int(NR / 2) + 1] / 1e3,
             a[int(NR / 4) + 1] / 1e3, a[int(3 * NR / 4) + 1] / 1e3}'
done
