#!/usr/bin/env bash
# The CPU engine against Hyperscan (same process, same threads) on rule
# shapes the shared sets lack (bench/gen_shapes.py: IDS-like regexes,
# binary signatures with two-byte anchors, hex strings with jumps) and on
# the shared sets, for one or more builds alternated. Prints one line per
# build, round and set: CPU GB/s, Hyperscan GB/s, their ratio, both hit
# counts. docs/PERFORMANCE.md "Session 30".
#   bench/cpu_shapes.sh [BUILD...]     (default: build-rel)
# Environment: THREADS (1), SIZE (32M), ITERS (3), ROUNDS (2), SHAPES
# ("ids anchors hexjump"), REAL (gitleaks-regex,gitleaks-keywords,dict-15),
# DATA (build-shared: a copy of ../shared/data).
set -u
BUILDS=${*:-build-rel}
THREADS=${THREADS:-1}
SIZE=${SIZE:-32M}
ITERS=${ITERS:-3}
ROUNDS=${ROUNDS:-2}
SHAPES=${SHAPES:-ids anchors hexjump}
REAL=${REAL:-gitleaks-regex,gitleaks-keywords,dict-15}
DATA=${DATA:-build-shared}
D=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d /tmp/cpu_shapes.XXXXXX)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/gitleaks" "$W/rebar/haystacks"
cp "$DATA/rebar/haystacks/sherlock.txt" "$W/rebar/haystacks/"
for sh in $SHAPES; do python3 "$D/gen_shapes.py" "$sh" 400 5 >"$W/$sh.rules"; done
run() { # BUILD NAME DATA ONLY
    timeout 600 "$1/bench/scan_bench" --engine cpu --threads "$THREADS" --only "$4" --data "$3" \
        --size "$SIZE" --iters "$ITERS" 2>&1 |
        awk -v b="$1" -v n="$2" '$1 ~ /^(gitleaks|dict|literals|regex)/ {
            print b, (n != "" ? n : $1), "cpu", $4, "hs", $5, "x", $6, "hits", $7, $8 }'
}
for r in $(seq "$ROUNDS"); do
    for b in $BUILDS; do
        for sh in $SHAPES; do
            cp "$W/$sh.rules" "$W/gitleaks/gitleaks-regex.rules"
            run "$b" "$sh" "$W" gitleaks-regex
        done
        [ -n "$REAL" ] && run "$b" "" "$DATA" "$REAL"
    done
done
