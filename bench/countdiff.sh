#!/usr/bin/env bash
# countdiff: `vkscan scan -c` through a running vkscand (the GPU path on a
# GPU host) against the CPU reference scanner (`vkscan rules scan`), per
# rule, on one file of SIZE_MIB MiB made of the set's haystack repeated.
# Prints one line per set (equal or not) and, where they differ, the rules
# that differ and the first ends one side has and the other lacks. ALL=1
# compares every hit (`vkscan scan` without -c) as well.
#
#   bench/countdiff.sh BUILD DATA [SIZE_MIB] [SETS...]
#
# DATA as for cli_bench.sh (NAME.rules, NAME.hay or default.hay).
set -u
BUILD=${1:?usage: countdiff.sh BUILD DATA [SIZE_MIB] [SETS...]}
DATA=${2:?usage: countdiff.sh BUILD DATA [SIZE_MIB] [SETS...]}
SIZE_MIB=${3:-256}
shift $(($# < 3 ? $# : 3))
OUT=${OUT:-/tmp/countdiff}
WORK=${WORK:-/tmp/countdiff-work}
mkdir -p "$OUT" "$WORK"
export LD_LIBRARY_PATH=$BUILD/client${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
sock=$WORK/vkscand.sock
rm -rf "$WORK/state"
"$BUILD/daemon/vkscand" --config "" --socket "$sock" --state-dir "$WORK/state" ${VKSCAND_ARGS:-} \
    --log-level notice >"$OUT/vkscand-$(basename "$BUILD").log" 2>&1 &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null' EXIT
for _ in $(seq 600); do grep -q "ready on" "$OUT/vkscand-$(basename "$BUILD").log" && break; sleep 0.1; done
sets=("$@")
[ ${#sets[@]} -eq 0 ] && for r in "$DATA"/*.rules; do sets+=("$(basename "$r" .rules)"); done
for name in "${sets[@]}"; do
    rules=$DATA/$name.rules
    hay=$DATA/$name.hay
    [ -f "$hay" ] || hay=$DATA/default.hay
    file=$WORK/$name.big
    want=$((SIZE_MIB * 1048576))
    reps=$(((want + $(stat -c %s "$hay") - 1) / $(stat -c %s "$hay")))
    for _ in $(seq "$reps"); do cat "$hay"; done | head -c "$want" >"$file"
    p=$OUT/$(basename "$BUILD")-$name
    "$BUILD/client/vkscan" --socket "$sock" scan -c --no-cache -r "$rules" "$file" 2>"$p.err" |
        awk -F: '{print $(NF-1), $NF}' | sort >"$p.gpu"
    "$BUILD/client/vkscan" rules scan "$rules" "$file" 2>>"$p.err" |
        awk -F: '{c[$NF]++} END {for (k in c) print k, c[k]}' | sort >"$p.ref"
    if cmp -s "$p.gpu" "$p.ref"; then
        echo "$name: counts equal ($(awk '{s += $2} END {print s}' "$p.ref") matches)"
        [ "${ALL:-0}" = 1 ] || continue
    else
        echo "$name: counts DIFFERENT (gpu $(awk '{s += $2} END {print s}' "$p.gpu"), reference $(awk '{s += $2} END {print s}' "$p.ref"))"
        join -a1 -a2 -e 0 -o 0,1.2,2.2 "$p.gpu" "$p.ref" | awk '$2 != $3 {print "  rule", $1, "gpu", $2, "reference", $3}'
    fi
    # the ends of the differing rules, every hit
    "$BUILD/client/vkscan" --socket "$sock" scan --no-cache -r "$rules" "$file" 2>/dev/null |
        awk -F: '{print $(NF), $(NF-1)}' | sort >"$WORK/gpu-hits"
    "$BUILD/client/vkscan" rules scan "$rules" "$file" 2>/dev/null |
        awk -F: '{print $(NF), $(NF-1)}' | sort >"$WORK/ref-hits"
    if cmp -s "$WORK/gpu-hits" "$WORK/ref-hits"; then
        echo "  every hit equal ($(wc -l <"$WORK/ref-hits"))"
        continue
    fi
    echo "  every hit: gpu $(wc -l <"$WORK/gpu-hits"), reference $(wc -l <"$WORK/ref-hits")"
    echo "  first hits only the GPU path has (rule end):"
    comm -23 "$WORK/gpu-hits" "$WORK/ref-hits" | head -n 5 | sed 's/^/    /'
    echo "  first hits only the reference has (rule end):"
    comm -13 "$WORK/gpu-hits" "$WORK/ref-hits" | head -n 5 | sed 's/^/    /'
done
