#!/usr/bin/env bash
# One $LARGE (default 16G) stream from a file through vkscand, literals-10000,
# 256 MiB descriptor writes, window 8 (issue 13's large stream), then every
# counter of `vkscan status --json` that the run moved, as "key delta".
#   bench/stream_large_stats.sh BUILD [vkscand args...]
set -u
B=${1:?usage: stream_large_stats.sh BUILD [vkscand args...]}
shift
. "$(dirname "$0")/h200_env.sh"
W=/tmp/sls
rm -rf $W && mkdir -p $W
"$B/daemon/vkscand" --config "" --socket $W/s.sock --state-dir $W/state --engine gpu \
    --log-level notice --max-scan-bytes 20G --tenant-max-bytes 40G "$@" >$W/d.log 2>&1 &
pid=$!
for _ in $(seq 200); do grep -q "ready on" $W/d.log && break; sleep 0.1; done
snap() { "$B/client/vkscan" --socket $W/s.sock status --json | tr ',' '\n' | tr -d '"{}[]' |
    awk -F: 'NF >= 2 && $NF ~ /^[0-9.]+$/ { print $(NF-1), $NF }' | LC_ALL=C sort; }
snap >$W/s0
timeout 250 "$B/bench/stream_bench" --socket $W/s.sock --threads 16 --iters ${ITERS:-2} --no-hs \
    --only large ${NO_BLOCK:+--no-block} ${COUNT:+--stream-count} --literals 10000 --large "${LARGE:-16G}" --large-write ${WRITE:-256M} \
    --file /tmp/sb16g --window ${WINDOW:-8} >$W/large.txt 2>&1
grep -E '^large iteration' $W/large.txt; grep -E -A2 '^large:' $W/large.txt | tail -n 2
snap >$W/s1
LC_ALL=C join $W/s0 $W/s1 | awk '$3 != $2 { printf "%s %.0f\n", $1, $3 - $2 }' | tr '\n' ';'
echo
kill $pid
wait $pid 2>/dev/null
