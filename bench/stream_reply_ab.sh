#!/usr/bin/env bash
# The loop's time answering a hit-dense stream, for two builds: vkscand on
# the CPU engine, one $LARGE (default 1G) stream in 256 MiB writes,
# literals-10000, mode all; prints stream_bench's line and the daemon's
# stream.writes, stream.hits, stream.reply_ns and stream.thread_replies.
#   bench/stream_reply_ab.sh OLD_BUILD NEW_BUILD
set -u
for B in "${1:?usage: stream_reply_ab.sh OLD_BUILD NEW_BUILD}" "${2:?}"; do
    W=$(mktemp -d)
    "$B/daemon/vkscand" --config "" --socket "$W/s.sock" --state-dir "$W/state" --engine cpu \
        --log-level notice --max-scan-bytes 2G --tenant-max-bytes 4G >"$W/d.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do grep -q "ready on" "$W/d.log" && break; sleep 0.1; done
    echo "== $B"
    "$B/bench/stream_bench" --socket "$W/s.sock" --threads 2 --iters "${ITERS:-3}" --no-hs \
        --no-block --only large --literals 10000 --large "${LARGE:-1G}" --large-write 256M \
        --file /tmp/stream_reply_ab.bin --window 2 2>&1 | grep -E '^large +[0-9]'
    "$B/client/vkscan" --socket "$W/s.sock" status --json | tr ',' '\n' |
        grep -E '"stream\.(reply_ns|hits|thread_replies|writes)"'
    kill $pid
    wait $pid 2>/dev/null
    rm -rf "$W"
done
rm -f /tmp/stream_reply_ab.bin
