#!/usr/bin/env bash
# Compile time, DFA groups and states of small rule sets that hold one
# broad counter (issue: dense counters, docs/engine.md step 4), for two
# builds of `vkscan`, median of 3 `vkscan rules check` runs each.
#   bench/compile_shapes.sh OLD_VKSCAN NEW_VKSCAN
set -u
OLD=${1:?usage: compile_shapes.sh OLD_VKSCAN NEW_VKSCAN}
NEW=${2:?usage: compile_shapes.sh OLD_VKSCAN NEW_VKSCAN}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
# small rules of every kind: bounded, anchored, caseless, UTF-8 bytes
cat >"$W/small" <<'R'
1:/x[^y]{1000,2000}y/s
2:/(ab|cd){10,20}/
3:/((a|b)c){3,5}d/
4:/[a-f]{2,}[0-9]{3}\B/
5:/\Bthe\b/i
6:/^foo$/m
7:/bar\z/
8:/baz\Z/
9:/\Aqux/
10:/(?m)^\s*#\s*include\s*<[a-z]+\.h>$/
11:/\d{3}-\d{2}-\d{4}/
12:/(?i:HeLLo) world/
13:/a{0,3}b{2}c{1,}/
14:/(\w+\s){5}\w+\./
15:/[^\x00-\x7f]{3,}/
16:/\xe4\xb8[\x80-\xbf]{1}/
R
row() { # name file
    for b in "$OLD" "$NEW"; do
        ms=$(for _ in 1 2 3; do "$b" rules check "$2" 2>&1 | head -1 | grep -o '[0-9.]* ms$'; done |
            sort -n | sed -n 2p)
        "$b" rules check "$2" 2>&1 | head -1 |
            N="$1" awk -v ms="$ms" '{ for (i = 1; i < NF; i++) { if ($(i+1) == "groups," && g == "") g = $i;
                if ($(i+1) == "states,") s = $i; if ($(i+1) == "bytes,") by = $i }
                printf "%s | %s | %s DFA groups, %s states, %s bytes, %s (median of 3)\n", ENVIRON["N"], b, g, s, by, ms }' b="$(basename "$(dirname "$(dirname "$b")")")"
    done
}
for c in '[^\n]{1000}' '[\x20-\x7e]{1024}' '[0-9a-f]{512}/i' '.{500}/s' '[A-Za-z0-9+\/]{300}' '.{2000}/s'; do
    pat="/${c}"
    case "$c" in */i | */s) ;; *) pat="$pat/" ;; esac
    (cat "$W/small"; printf '99:%s\n' "$pat") >"$W/set"
    row "16 small + $pat" "$W/set"
done
