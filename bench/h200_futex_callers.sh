#!/usr/bin/env bash
# Where vkscand's event loop thread (tid = the process id) spends its time,
# and who makes it wait on a futex, at 64 clients of
# 4 KiB scans: perf record -g of the daemon, then, for the loop thread's
# samples whose stack holds futex_wait (or futex_wake), the first frame of
# vkscand's own code, counted. Carry .gl, BUILD and build-perf.
#   bench/h200_futex_callers.sh BUILD [vkscand flags...]
set -u
B=${1:?usage: h200_futex_callers.sh BUILD [flags]}
shift
. "$(dirname "$0")/h200_env.sh"
P="env LD_LIBRARY_PATH=$PWD/build-perf/lib:${LD_LIBRARY_PATH:-} build-perf/perf"
rm -rf /tmp/v && mkdir -p /tmp/v
$P record -e cpu-clock -F 4999 -g -o /tmp/v/perf.data -- "$B/daemon/vkscand" --config "" \
    --socket /tmp/v/s.sock --state-dir /tmp/v/st --log-level notice "$@" >"$OUT/vkscand-futex.log" 2>&1 &
for _ in $(seq 600); do grep -q "ready on" "$OUT/vkscand-futex.log" && break; sleep 0.1; done
D=$(pgrep -n -x vkscand)
timeout 30 "$B/bench/rpc_bench" --socket /tmp/v/s.sock --seconds 4 --clients 64 \
    --workloads small --inputs inline --big-mib 1 | grep -E '^4KiB'
pkill -INT -f "$B/daemon/vkscand"
sleep 3
$P script -i /tmp/v/perf.data --tid "$D" -F ip,sym 2>/dev/null >/tmp/v/stacks.txt
for what in futex_wait futex_wake finish_task_switch; do
    echo "== loop thread samples with $what in the stack, by the first vkscand frame"
    awk -v w="$what" '
        /^$/ { if (has) { n[first == "" ? "(none)" : first]++; tot++ } has = 0; first = ""; k = 0; next }
        { sym = $2; if (index(sym, w)) has = 1
          if (k < 3 && sym ~ /^(session_|server_|engine_|on_|proto_|sched_|store_|stream_|flush|send_|reply_|request_|op_|uv_|pthread_|write_|read_|malloc|free|calloc|realloc|cfree)/) { first = first (k ? " < " : "") sym; k++ } }
        END { for (k in n) printf "%6d %5.1f%% %s\n", n[k], 100 * n[k] / tot, k; print "total", tot }' \
        /tmp/v/stacks.txt | sort -rn | head -n 15
done
echo "== loop thread (tid $D) samples: $(grep -c '^$' /tmp/v/stacks.txt)"
echo "== loop thread, self time by symbol"
$P report -i /tmp/v/perf.data --tid "$D" --no-children --sort symbol -g none 2>/dev/null |
    grep '%' | head -n 30
echo "== loop thread, with children, by symbol"
$P report -i /tmp/v/perf.data --tid "$D" --children --sort symbol -g none 2>/dev/null |
    grep '%' | grep -vE '\[k\] (entry_|do_syscall|x64_sys)' | head -n 45
