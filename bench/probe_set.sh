#!/usr/bin/env bash
# probe_set: one rule set through vkscand on a GPU host, to see which engine
# ran it and where the time went. For each RULES file: `vkscan scan -c
# --no-cache` of HAY repeated to SIZE_MIB (first untimed, then 3 timed), the
# daemon's engine counters that moved, and its warnings.
#   bench/probe_set.sh BUILD HAY SIZE_MIB RULES...
set -u
B=${1:?usage: probe_set.sh BUILD HAY SIZE_MIB RULES...}
HAY=${2:?}
SIZE=${3:?}
shift 3
. "$(dirname "$0")/h200_env.sh"
W=/tmp/probe
rm -rf $W && mkdir -p $W
want=$((SIZE * 1048576))
reps=$(((want + $(stat -c %s "$HAY") - 1) / $(stat -c %s "$HAY")))
for _ in $(seq "$reps"); do cat "$HAY"; done | head -c "$want" >$W/f
"$B/daemon/vkscand" --config "" --socket $W/s.sock --state-dir $W/st --log-level notice \
    ${VKSCAND_ARGS:-} >$W/d.log 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q "ready on" $W/d.log && break; sleep 0.1; done
snap() { "$B/client/vkscan" --socket $W/s.sock status --json | tr ',' '\n' | tr -d '"{}[]' |
    awk -F: 'NF >= 2 && $NF ~ /^[0-9.]+$/ { print $(NF-1), $NF }' | LC_ALL=C sort; }
for r in "$@"; do
    "$B/client/vkscan" --socket $W/s.sock scan -c --no-cache -r "$r" $W/f >/dev/null 2>&1
    snap >$W/s0
    : >$W/t
    for _ in 1 2 3; do
        /usr/bin/time -q -f %e -a -o $W/t "$B/client/vkscan" --socket $W/s.sock scan -c --no-cache \
            -r "$r" $W/f >$W/c 2>&1
    done
    snap >$W/s1
    echo "$(basename "$r"): $(sort -g $W/t | sed -n 2p) s (median of 3), hits $(awk -F: '{s += $NF} END {print s + 0}' $W/c)"
    LC_ALL=C join $W/s0 $W/s1 | awk '$3 != $2 && $1 !~ /bucket|_total$/ { printf "%s %.0f; ", $1, $3 - $2 }' |
        grep -oE '(engine\.[0-9]\.[a-z_]+|cpu[a-z_.]*|gpu_[a-z_.]*|batches|segments|kernel[a-z_]*|passes|[a-z_]*retr[a-z_]*|[a-z_]*_ns) -?[0-9]+' |
        tr '\n' ';' | cut -c1-900
    echo
done
grep -iE 'warn|error|re-run' $W/d.log | sort | uniq -c | head -n 10
kill $pid
wait $pid 2>/dev/null
