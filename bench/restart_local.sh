#!/usr/bin/env bash
# Start-to-first-scan on this machine: vkscand is started on a state
# directory whose disk cache already holds the catalog, and `vkscan scan`
# runs as soon as the socket exists; prints the milliseconds from the
# daemon's exec to the scan's exit, and to READY (the "ready on" line).
# docs/PERFORMANCE.md "Session 28".
#   bench/restart_local.sh BUILD [RUNS] [vkscand flags...]
set -u
B=${1:?usage: restart_local.sh BUILD [RUNS] [vkscand flags...]}
RUNS=${2:-5}
shift 2 2>/dev/null || shift $#
RULES=${RULES:-build-shared/rebar/dict-15.rules}
W=$(mktemp -d /tmp/restart_local.XXXXXX)
trap 'rm -rf "$W"' EXIT
head -c 65536 /dev/urandom | base64 >"$W/hay"
now_ms() { date +%s%3N; }
for r in $(seq 0 "$RUNS"); do
    rm -f "$W/s.sock"
    t0=$(now_ms)
    "$B/daemon/vkscand" --config "" --socket "$W/s.sock" --state-dir "$W/state" \
        --log-level info "$@" >"$W/d.log" 2>&1 &
    pid=$!
    until [ -S "$W/s.sock" ]; do sleep 0.001; done
    "$B/client/vkscan" --socket "$W/s.sock" scan -c --no-cache -r "$RULES" "$W/hay" >/dev/null 2>"$W/scan.err"
    rc=$?
    t1=$(now_ms)
    until grep -q "ready on" "$W/d.log"; do sleep 0.005; done
    ready=$(sed -n 's/.* in \([0-9.]*\) ms (config.*/\1/p' "$W/d.log")
    eng=$("$B/client/vkscan" --socket "$W/s.sock" status --json | tr ',' '\n' | grep -E '"startup_accept_ns"' | sed 's/.*://')
    # run 0 compiles the catalog into the disk cache; the others start warm
    echo "run $r: first scan answered $((t1 - t0)) ms after exec (rc $rc); accepting $((${eng:-0} / 1000000)) ms, ready $ready ms"
    kill "$pid"
    wait "$pid" 2>/dev/null
done
