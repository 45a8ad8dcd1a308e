#!/usr/bin/env bash
# Session 12's H200 call: the GPU tests; the gate sweep (rules_options.
# gate_rare_bits: candidates whose factors are rare in text gated without
# trying their DFA) on the regex sets, 1 GiB as 1 MiB buffers and as one
# buffer; the hit-dense sets after the finish's report modes went onto the
# upload threads; then the CLI path (bench/h200_session10.sh cli tel).
# Carry .gl (with .gl/extra), BUILD, build-shared, build-data.
#
#   bench/h200_session12.sh BUILD [steps...]
#   steps: tests gate dense all all1g groups prof regex cli cli16 caps
#
# GATES: the gate_rare_bits values to sweep (default: off 28 24 20 16).
# all: every workload as 1 MiB buffers; all1g: as one 1 GiB buffer (no
# Hyperscan: one buffer is one thread for it); groups: gated_group_bits
# 64 and 256 against the default on the regex sets.
set -u
B=${1:?usage: h200_session12.sh BUILD [steps...]}
shift
WHAT=${*:-tests gate dense cli}
OUT=${OUT:-/tmp/vks-out}
mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done
ldconfig
for f in .gl/extra/*.deb; do dpkg -x "$f" /opt/vks-extra >/dev/null 2>&1; done
export LD_LIBRARY_PATH=/opt/vks-extra/usr/lib/x86_64-linux-gnu
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
if has tests; then
    for t in test_gpu test_fault; do
        timeout 120 "$B/tests/$t" >"$OUT/$t.txt" 2>&1
        echo "$t exit $?: $(grep -E 'Checks' "$OUT/$t.txt" | tail -n 1)"
        grep -E ':[EF]:' "$OUT/$t.txt" | head -n 5
    done
fi
scan() {
    local name=$1 limit=$2
    shift 2
    timeout "$limit" "$B/bench/scan_bench" --data build-shared "$@" >"$OUT/scan_$name.txt" 2>&1
    echo "scan_bench $name exit $?"
    grep -A6 -E '^median of iters' "$OUT/scan_$name.txt" | grep -v '^ *$'
    grep -A4 -E '^engines' "$OUT/scan_$name.txt" | grep -v '^engines' | awk '{print "  passes", $1, $NF}'
    grep -A4 -E '^telemetry' "$OUT/scan_$name.txt" | grep -v '^ *$'
    grep -E '^[a-z].* (no|NO)$' "$OUT/scan_$name.txt"
}
if has gate; then
    for g in ${GATES:-4294967295 28 24 20 16}; do
        scan gate$g-1m 150 --iters 5 --size 1G --buffer 1048576 --real-buffer 1048576 \
            --only regex-500,gitleaks-regex --gate-rare-bits $g
    done
    for g in ${GATES1G:-4294967295 20}; do
        scan gate$g-1g 150 --iters 5 --size 1G --buffer 1073741824 --real-buffer 1073741824 \
            --only regex-500,gitleaks-regex --gate-rare-bits $g
    done
fi
ALL=literals-1000,literals-10000,regex-500,regex-500-secrets,binary-20k,phrases-3k,dict-10,gitleaks-keywords,gitleaks-regex
if has all; then
    scan all-1m 300 --iters 5 --size 1G --buffer 1048576 --real-buffer 1048576 --only "$ALL"
fi
if has all1g; then
    scan all-1g 300 --iters 5 --size 1G --buffer 1073741824 --real-buffer 1073741824 --no-hs --only "$ALL"
fi
if has groups; then
    for g in 64 256; do
        scan groups$g-1m 150 --iters 5 --size 1G --buffer 1048576 --real-buffer 1048576 \
            --only regex-500,regex-500-secrets,gitleaks-regex --gated-group-bits $g
    done
fi
REGEX=regex-500,regex-500-secrets,gitleaks-regex
if has prof; then
    # where the device time goes, dispatch by dispatch (gpu_options.profile)
    scan prof-1m 200 --iters 3 --size 1G --buffer 1048576 --real-buffer 1048576 --profile 1 \
        --only "$REGEX,dict-10,phrases-3k,binary-20k"
    grep -A8 '^profile' "$OUT/scan_prof-1m.txt"
fi
if has regex; then
    scan regex-1m 150 --iters 5 --size 1G --buffer 1048576 --real-buffer 1048576 --only "$REGEX"
    scan regex-1g 150 --iters 5 --size 1G --buffer 1073741824 --real-buffer 1073741824 --no-hs \
        --only "$REGEX"
fi
if has dense; then
    scan dense-1m 150 --iters 5 --size 1G --buffer 1048576 --real-buffer 1048576 \
        --only phrases-3k,dict-10,gitleaks-keywords,literals-1000
fi
if has cli; then
    TEL_RUNS=${TEL_RUNS:-3} bash bench/h200_session10.sh "$B" cli tel
fi
if has cli16; then
    # the same with 16 upload threads in vkscand (default: one per core, at most 8)
    OUT=$OUT/cli16 VKSCAND_UPLOAD_THREADS=16 TEL_RUNS=1 bash bench/h200_session10.sh "$B" cli tel
fi
if has caps; then
    # confirmation caps and speculative lookback against the 1 MiB-buffer gap
    # of the gated sets (call 6: 3-4x the device time of one 1 GiB buffer)
    for a in "" "--confirm-cap 65536" "--confirm-cap 4096" "--spec-lookback 256"; do
        n=caps$(echo "$a" | tr -dc 'a-z0-9')
        scan $n 150 --iters 3 --size 1G --buffer 1048576 --real-buffer 1048576 --no-hs --profile 1 \
            --only regex-500-secrets,gitleaks-regex $a
        grep -A3 '^profile' "$OUT/scan_$n.txt"
    done
fi
