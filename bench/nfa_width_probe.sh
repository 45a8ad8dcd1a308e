#!/usr/bin/env bash
# nfa_width_probe: one wide bit-NFA rule a catalog, through vkscand's GPU
# engine, at widths that pick each large MAX_WORDS of the bit-NFA kernel
# (512, 1024, 2048 words): prints, per width, the hits against the CPU
# reference and the daemon's log lines of that scan (a pipeline the driver
# could not build is logged, and the scan re-run on the CPU engine).
#   bench/nfa_width_probe.sh BUILD
set -u
BUILD=${1:?usage: nfa_width_probe.sh BUILD}
W=$(mktemp -d /tmp/nfa_width.XXXXXX)
export LD_LIBRARY_PATH=$BUILD/client${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export VKSCAN_SOCKET=$W/sock
"$BUILD/daemon/vkscand" --config "" --socket "$VKSCAN_SOCKET" --state-dir "$W/state" \
    --engine gpu ${VKSCAND_ARGS:-} --log-level info >"$W/log" 2>&1 &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$W"' EXIT
for _ in $(seq 600); do grep -q "ready on" "$W/log" && break; sleep 0.1; done
rep() { head -c "$2" /dev/zero | tr '\0' "$1"; }
{
    for k in 15000 16000 20000 28000; do
        printf 'abc'; rep 0 "$k"; printf 'xyz\n'
        printf 'abc'; rep 0 "$k"; rep a "$k"; printf 'xyz\n'
    done
} >"$W/hay"
for spec in "512 1:/abc[0-9a-f]{16000}xyz/" "1024 1:/abc[0-9a-f]{15000}[a-z]{15000}xyz/" \
    "2048 1:/abc[0-9a-f]{20000}[a-z]{20000}xyz/" "2048 1:/abc[0-9a-f]{28000}[a-z]{28000}xyz/"; do
    words=${spec%% *}
    echo "${spec#* }" >"$W/r.rules"
    bits=$("$BUILD/client/vkscan" rules check "$W/r.rules" 2>&1 | grep -o '[0-9]* bits' | head -n 1)
    before=$(wc -l <"$W/log")
    got=$("$BUILD/client/vkscan" scan --no-cache -r "$W/r.rules" "$W/hay" 2>&1 | tr '\n' ' ')
    want=$("$BUILD/client/vkscan" rules scan "$W/r.rules" "$W/hay" 2>&1 | tr '\n' ' ')
    echo "MAX_WORDS $words ($bits): gpu [$got] reference [$want]"
    tail -n +"$((before + 1))" "$W/log" | grep -v "^$" | cut -c1-200 | sed 's/^/  log: /'
done
