#!/usr/bin/env bash
# fuzz_rules on every core of the H200 machine (issue 8: 10^7 executions of
# the rules target in total). Carry build-fuzz9 (the clang fuzz build:
#   CC=clang meson setup build-fuzz9 -Dfuzz=true -Dtests=false -Db_lundef=false \
#       -Dbuildtype=debugoptimized && ninja -C build-fuzz9 tests/fuzz_rules)
# and run from the repository root:
#
#   bench/fuzz_h200.sh SECONDS [JOBS]        (JOBS: 16 by default)
#
# The corpus starts from tests/fuzz/seeds-rules (copied: the tree is not
# written) and ends in $OUT/corpus-rules with every worker's log
# ($OUT/fuzz-N.log) and any crash ($OUT/crash-*). Prints each worker's
# executions and their total. Merge what it found back on the development
# machine with
#   build-fuzz9/tests/fuzz_rules -merge=1 tests/fuzz/seeds-rules OUT/corpus-rules
set -u
SECS=${1:?usage: fuzz_h200.sh SECONDS [JOBS]}
JOBS=${2:-16}
OUT=${OUT:-/tmp/vks-out}
BIN=${BIN:-build-fuzz9/tests/fuzz_rules} # BIN: another fuzz build of the target
[ -x "$BIN" ] || { echo "no $BIN: carry build-fuzz9" >&2; exit 2; }
mkdir -p "$OUT/corpus-rules"
cp tests/fuzz/seeds-rules/* "$OUT/corpus-rules/"
nproc | sed 's/^/cores /'
cd "$OUT" || exit 2
# -jobs/-workers: JOBS processes, each running until max_total_time; each
# writes fuzz-N.log in the current directory.
"$OLDPWD/$BIN" corpus-rules -jobs="$JOBS" -workers="$JOBS" -max_total_time="$SECS" \
    -print_final_stats=1 -rss_limit_mb=4096 -timeout=10 -artifact_prefix="$OUT/" \
    >"$OUT/fuzz-main.log" 2>&1
rc=$?
total=0
for f in fuzz-*.log; do
    [ "$f" = fuzz-main.log ] && continue
    n=$(grep -E '^stat::number_of_executed_units' "$f" | tail -n 1 | awk '{print $2}')
    cov=$(grep -oE 'cov: [0-9]+' "$f" | tail -n 1)
    echo "$f: ${n:-?} execs, $cov"
    total=$((total + ${n:-0}))
done
echo "total executions: $total in ${SECS}s with $JOBS workers (libFuzzer exit $rc)"
ls "$OUT"/crash-* "$OUT"/leak-* "$OUT"/timeout-* "$OUT"/oom-* 2>/dev/null | sed 's/^/finding: /'
echo "corpus: $(ls corpus-rules | wc -l) inputs"
