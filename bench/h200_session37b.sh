#!/usr/bin/env bash
# Session 37's later GPU-host calls: OLD against NEW on the gated sets.
# scan_bench's factor-pass split (plan, upload, wait, sort) on 256 MiB of
# wordy-300 and leads and one 1 GiB buffer of gitleaks-regex, then the CLI
# (cli_bench, 3 runs) over build-gated at 256 MiB and build-data at 1 GiB.
# Carry .gl, OLD, NEW, build-gated, build-data, build-probe-wordy-300,
# build-probe-leads, build-probe-gitleaks-regex.
#   bench/h200_session37b.sh OLD NEW [steps...]     steps: profile cli
set -u
OLD=${1:?usage: h200_session37b.sh OLD NEW [steps...]}
NEW=${2:?usage: h200_session37b.sh OLD NEW [steps...]}
shift 2
WHAT=${*:-profile cli}
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
D=$(dirname "$0")
. "$D/h200_env.sh"
S=$OUT/summary.txt
step() { echo "== $1 ($(date +%T))" | tee -a "$S"; }
nvidia-smi -L | tee -a "$S"
# profile BUILD SET SIZE [BUFFER]: scan_bench's tables for one set
profile() {
    local buf=()
    [ -n "${4:-}" ] && buf=(--buffer "$4")
    step "$1: scan_bench $2, $3 ${4:+in one buffer}"
    timeout 90 "$1/bench/scan_bench" --data "build-probe-$2" --only gitleaks-regex --size "$3" \
        "${buf[@]}" --iters 5 --threads 16 2>&1 | grep -v 'iteration\|warm-up\|^device' |
        grep -A1 -E "^(workload|median|telemetry|factor)" | grep -v "^--" | tee -a "$S"
}
if has profile; then
    for b in "$OLD" "$NEW"; do
        profile "$b" wordy-300 256M
        profile "$b" leads 256M
        profile "$b" gitleaks-regex 1G 1G
    done
fi
has cli && for b in "$OLD" "$NEW"; do
    step "$b: build-gated, 256 MiB"
    OUT=$OUT/gated-$(basename "$b") VKSCAN_ARGS=--no-cache timeout 120 \
        bash "$D/cli_bench.sh" "$b" build-gated 256 3 2>&1 | tee -a "$S"
    step "$b: build-data, 1 GiB"
    OUT=$OUT/cli-$(basename "$b") VKSCAN_ARGS=--no-cache timeout 120 \
        bash "$D/cli_bench.sh" "$b" build-data 1024 3 2>&1 | tee -a "$S"
done
