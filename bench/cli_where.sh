#!/usr/bin/env bash
# cli_where: where one `vkscan scan -c --no-cache` of a 1 GiB file spends
# its wall time. For each rule set: three scans of the 1 GiB file and three
# of a 4 KiB file (the command's fixed cost), each with the wall time and the
# reply's whole telemetry line (VKSCAN_TELEMETRY), against one vkscand with
# the default config and DAEMON_ARGS (e.g. --max-scan-bytes 128M, which
# makes the CLI send the 1 GiB file as a stream of 128 MiB pieces). STATUS=1:
# the daemon's stream counters at the end (stream.run_ns, .fd_read_ns,
# .scan_*: where the stream writes spent their time).
#   bench/cli_where.sh BUILD DATA [SETS...]
# DATA: *.rules and default.hay, as for cli_bench.sh. SETS default: every
# *.rules in DATA. Needs the runtime of h200_env.sh on a GPU host.
set -u
B=${1:?usage: cli_where.sh BUILD DATA [SETS...]}
D=${2:?usage: cli_where.sh BUILD DATA [SETS...]}
shift 2
SETS=${*:-$(cd "$D" && ls *.rules | sed 's/\.rules$//')}
W=${WORK:-/tmp/cli-where}
mkdir -p "$W"
want=1073741824
if [ ! -f "$W/big" ] || [ "$(stat -c %s "$W/big")" -ne $want ]; then
    reps=$(((want + $(stat -c %s "$D/default.hay") - 1) / $(stat -c %s "$D/default.hay")))
    for _ in $(seq "$reps"); do cat "$D/default.hay"; done | head -c $want >"$W/big"
fi
head -c 4096 "$D/default.hay" >"$W/small"
cat "$W/big" >/dev/null
"$B/daemon/vkscand" --config "" --socket "$W/s.sock" --state-dir "$W/st" --log-level notice ${DAEMON_ARGS:-} \
    >"$W/d.log" 2>&1 &
daemon=$!
for _ in $(seq 300); do grep -q "ready on" "$W/d.log" && break; sleep 0.1; done
now() { date +%s.%N; }
for r in $SETS; do
    # the first command loads and compiles the catalog; not counted
    "$B/client/vkscan" --socket "$W/s.sock" scan -c --no-cache -r "$D/$r.rules" "$W/small" >/dev/null
    for f in big small; do
        for i in 1 2 3; do
            s=$(now)
            t=$(VKSCAN_TELEMETRY=1 "$B/client/vkscan" --socket "$W/s.sock" scan -c --no-cache \
                -r "$D/$r.rules" "$W/$f" 2>&1 >"$W/out" | grep -o "client_rpc_ns=.*")
            e=$(now)
            echo "$r $f wall_s=$(awk -v a="$s" -v b="$e" 'BEGIN{printf "%.4f", b-a}') counts_md5=$(md5sum <"$W/out" | cut -c1-8) $t"
        done
    done
done
# the daemon's stream counters (time by phase of the stream writes)
[ -n "${STATUS:-}" ] && "$B/client/vkscan" --socket "$W/s.sock" status --json | tr ',' '\n' |
    grep -E '"stream\.(run_ns|fd_read_ns|scan_)' | tr -d '"' | tr '\n' ' ' && echo
kill -TERM $daemon
wait $daemon
