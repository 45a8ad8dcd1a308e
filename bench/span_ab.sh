#!/usr/bin/env bash
# span_ab: `vkscan scan -c --no-cache` through vkscand --engine cpu, OLD and
# NEW release builds alternated, on rule sets whose factors follow an
# unbounded lead (docs/engine.md "Span runs"), medians of ITERS (default 3).
#   bench/span_ab.sh OLD NEW HAY SIZE_MIB RULES...
set -u
OLD=${1:?usage: span_ab.sh OLD NEW HAY SIZE_MIB RULES...}
NEW=${2:?}
HAY=${3:?}
SIZE=${4:?}
shift 4
W=/tmp/span-ab
rm -rf $W && mkdir -p $W
want=$((SIZE * 1048576))
reps=$(((want + $(stat -c %s "$HAY") - 1) / $(stat -c %s "$HAY")))
for _ in $(seq "$reps"); do cat "$HAY"; done | head -c "$want" >$W/f
start() { # BUILD LABEL
    "$1/daemon/vkscand" --config "" --socket $W/$2.sock --state-dir $W/st-$2 --engine cpu \
        --log-level notice ${VKSCAND_ARGS:-} >$W/$2.log 2>&1 &
    for _ in $(seq 300); do grep -q "ready on" $W/$2.log && break; sleep 0.1; done
}
start "$OLD" old
start "$NEW" new
for r in "$@"; do
    line="$(basename "$r"):"
    for label in old new; do
        b=$OLD
        [ $label = new ] && b=$NEW
        "$b/client/vkscan" --socket $W/$label.sock scan -c --no-cache -r "$r" $W/f >$W/c 2>&1
        : >$W/t
        for _ in $(seq "${ITERS:-3}"); do
            /usr/bin/time -q -f %e -a -o $W/t "$b/client/vkscan" --socket $W/$label.sock scan -c \
                --no-cache -r "$r" $W/f >$W/c 2>&1
        done
        line="$line $label $(sort -g $W/t | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}') s ($(awk -F: '{s += $NF} END {print s + 0}' $W/c) hits);"
    done
    echo "$line"
done
pkill -f "socket $W/" 2>/dev/null
