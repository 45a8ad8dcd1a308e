#!/usr/bin/env bash
# Issue 10's warm restart on the H200, after the preload (docs/daemon.md
# "Warm restart"). Carry .gl (with .gl/extra), BUILD (a release build),
# build-data and build-shared (a copy of ../shared/data).
#
#   bench/h200_restart.sh BUILD
#
# vkscand at its defaults loads build-data/literals-10000.rules once (disk
# catalog cache, pipeline cache and the list of the catalogs used last
# written at its stop), then for each setting in $SETS (`|`-separated
# vkscand flags; default: the defaults, then preload and warm-up off) it is
# stopped and started $RESTARTS times (default 4): ms from its start to
# "ready on" (the start phases from that log line), then the wall of
# `vkscan scan -c --no-cache` of a 4 KiB file, of a 64 MiB file (first) and
# of the same again twice (warm); then once more with the 64 MiB file
# first, right at ready. The daemon's own lines (ready phases, preload,
# batch buffers set up) follow each run.
set -u
B=${1:?usage: h200_restart.sh BUILD}
. "$(dirname "$0")/h200_env.sh"
W=/tmp/rs2
rm -rf $W && mkdir -p $W
head -c 67108864 build-shared/rebar/haystacks/sherlock.txt >$W/f64 2>/dev/null
while [ "$(stat -c %s $W/f64)" -lt 67108864 ]; do cat $W/f64 $W/f64 | head -c 67108864 >$W/t; mv $W/t $W/f64; done
head -c 4096 $W/f64 >$W/f4k
R=build-data/literals-10000.rules
LOG=$OUT/restart2_d.log
ms() { echo "$1 $2" | awk '{printf "%.1f", ($2 - $1) / 1e6}'; }
start_d() {
    : >"$LOG"
    t0=$(date +%s%N)
    # shellcheck disable=SC2086
    "$B/daemon/vkscand" --config "" --socket $W/s.sock --state-dir $W/st \
        --log-level info $1 >>"$LOG" 2>&1 &
    dpid=$!
    for _ in $(seq 5000); do grep -q "ready on" "$LOG" && break; sleep 0.002; done
    tr=$(date +%s%N)
}
stop_d() {
    kill -TERM $dpid
    wait $dpid
    grep -E "ready on|preloaded|resident, its pipelines|batch buffers" "$LOG" | sed 's/^<[0-9]>//; s/^/    /'
}
scan_ms() {
    local a b
    a=$(date +%s%N)
    timeout 30 "$B/client/vkscan" --socket $W/s.sock scan -c --no-cache -r $R "$1" >/dev/null 2>&1
    b=$(date +%s%N)
    ms "$a" "$b"
}
start_d ""
echo "cold start (no cache): ready $(ms $t0 $tr) ms; 4K $(scan_ms $W/f4k) ms; 64M $(scan_ms $W/f64) ms; 64M $(scan_ms $W/f64) ms"
stop_d
IFS='|' read -r -a SETTINGS <<<"${SETS:-|--preload-catalogs 0 --warm-bytes 0}"
for s in "${SETTINGS[@]}"; do
    echo "== vkscand ${s:-defaults}"
    for i in $(seq "${RESTARTS:-4}"); do
        start_d "$s"
        echo "restart $i: ready $(ms $t0 $tr) ms; 4K $(scan_ms $W/f4k) ms; 64M first $(scan_ms $W/f64) ms; 64M warm $(scan_ms $W/f64) ms, $(scan_ms $W/f64) ms"
        stop_d
    done
    start_d "$s"
    echo "64M at ready: ready $(ms $t0 $tr) ms; 64M first $(scan_ms $W/f64) ms; 64M warm $(scan_ms $W/f64) ms"
    stop_d
done
ls -la $W/st $W/st/catalogs | head -20
