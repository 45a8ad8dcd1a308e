#!/usr/bin/env bash
# gpu_diff: random rule sets through a running vkscand (the GPU path on a GPU
# host, lavapipe elsewhere) against the CPU reference scanner, every hit.
# The sets and haystacks come from bench/gen_random_sets.py; each haystack
# is repeated into a file of SIZE_KIB KiB. Per set, three scans are held to
# `vkscan rules scan` on that file:
#   all     `vkscan scan`            every (rule, end)
#   count   `vkscan scan -c`         per-rule counts
#   stream  `vkscan scan -` on a pipe, read in pieces by the CLI: every
#           (rule, end) again (left out for sets with `L` rules, which
#           streams refuse)
# Prints one line per set that differs, with the first hits only one side
# has, and a total line "N sets, N differ". Exit status 1 if any differ.
#
#   bench/gpu_diff.sh BUILD SETS_DIR [SIZE_KIB] [JOBS]
#
# VKSCAND_ARGS adds daemon options; MAX_HITS is vkscand's max-hits (2 M by
# default: the sets are hit-dense; at 4 M and more a reply can pass the
# 64 MiB max-unsent-bytes and frame limits). A scan the daemon cut at max-hits counts as a difference: the
# stderr shown says so. OUT keeps the differing sets'
# files.
set -u
BUILD=${1:?usage: gpu_diff.sh BUILD SETS_DIR [SIZE_KIB] [JOBS]}
SETS=${2:?usage: gpu_diff.sh BUILD SETS_DIR [SIZE_KIB] [JOBS]}
SIZE_KIB=${3:-4096}
JOBS=${4:-4}
OUT=${OUT:-/tmp/gpu_diff}
WORK=$(mktemp -d /tmp/gpu_diff.XXXXXX)
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$BUILD/client${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export VKSCAN_SOCKET=$WORK/vkscand.sock
"$BUILD/daemon/vkscand" --config "" --socket "$VKSCAN_SOCKET" --state-dir "$WORK/state" \
    --max-hits "${MAX_HITS:-2097152}" ${VKSCAND_ARGS:-} --log-level notice >"$OUT/vkscand.log" 2>&1 &
daemon=$!
# on a timeout's TERM the pipeline below stops first, so the sets cut short
# (their scans fail once the daemon is gone) are not printed as differences
trap 'pkill -TERM -P $$' TERM
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 600); do grep -q "ready on" "$OUT/vkscand.log" && break; sleep 0.1; done
grep -q "ready on" "$OUT/vkscand.log" || { echo "vkscand did not start" >&2; exit 2; }
VK=$BUILD/client/vkscan

# one set: prints "NAME ok HITS" or the difference
one() {
    local rules=$1 name w file ref
    name=$(basename "$rules" .rules)
    w=$WORK/$name
    mkdir -p "$w"
    file=$w/data
    local hay=${rules%.rules}.hay want=$((SIZE_KIB * 1024))
    local reps=$(((want + $(stat -c %s "$hay") - 1) / $(stat -c %s "$hay")))
    for _ in $(seq "$reps"); do cat "$hay"; done | head -c "$want" >"$file"
    "$VK" rules scan "$rules" "$file" 2>"$w/ref.err" |
        awk -F: '{print $NF, $(NF-1)}' | LC_ALL=C sort >"$w/ref"
    awk '{c[$1]++} END {for (k in c) print k, c[k]}' "$w/ref" | LC_ALL=C sort >"$w/ref.count"
    "$VK" scan --no-cache -r "$rules" "$file" 2>"$w/all.err" |
        awk -F: '{print $NF, $(NF-1)}' | LC_ALL=C sort >"$w/all"
    "$VK" scan -c --no-cache -r "$rules" "$file" 2>"$w/count.err" |
        awk -F: '{print $(NF-1), $NF}' | LC_ALL=C sort >"$w/count"
    local modes="all count"
    if ! grep -q '^# has L rules' "$rules"; then
        cat "$file" | "$VK" scan -r "$rules" - 2>"$w/stream.err" |
            awk -F: '{print $NF, $(NF-1)}' | LC_ALL=C sort >"$w/stream"
        modes="$modes stream"
    fi
    local bad=""
    for m in $modes; do
        local want_f=$w/ref
        [ "$m" = count ] && want_f=$w/ref.count
        cmp -s "$w/$m" "$want_f" || bad="$bad $m"
    done
    if [ -z "$bad" ]; then
        echo "$name ok $(wc -l <"$w/ref")"
        rm -rf "$w"
        return
    fi
    echo "$name DIFFERS in$bad (reference $(wc -l <"$w/ref") hits)"
    for m in $bad; do
        local want_f=$w/ref
        [ "$m" = count ] && want_f=$w/ref.count
        echo "  $m: only $m has: $(LC_ALL=C comm -23 "$w/$m" "$want_f" | head -n 3 | tr '\n' ';')" \
            "only the reference has: $(LC_ALL=C comm -13 "$w/$m" "$want_f" | head -n 3 | tr '\n' ';')" \
            "stderr: $(head -c 300 "$w/$m.err" | tr '\n' ' ')"
    done
    mkdir -p "$OUT/$name"
    cp "$rules" "$hay" "$OUT/$name/"
    rm -rf "$w"
}
export -f one
export WORK SIZE_KIB VK
# differences are printed as they come, so a run cut short still shows them
ls "$SETS"/*.rules | xargs -P "$JOBS" -I{} bash -c 'one {}' | tee "$WORK/results" |
    grep --line-buffered -v ' ok ' || true
n=$(grep -c -E " ok |DIFFERS" "$WORK/results")
bad=$(grep -c DIFFERS "$WORK/results")
hits=$(awk '$2 == "ok" {s += $3} END {print s + 0}' "$WORK/results")
echo "$n sets, $bad differ ($hits hits in the sets that agree, ${SIZE_KIB} KiB each)"
[ "$bad" = 0 ]
