#!/usr/bin/env bash
# The next H200 call after session 30 (no device was lent in sessions 29's
# last call and 30). Carry .gl, build-shared, build-data, BUILD (a release
# build of HEAD, with bench/scan_bench) and OLD (a release build of
# d886431, session 29's last; or ccb6b45, measured in session 29).
#   bench/h200_session30.sh BUILD OLD [steps...]
# Steps:
#   s29      session 29's pending call: bench/h200_session29.sh BUILD OLD
#            restart small tests (restart to the first scan under auto and
#            cpu, 4 KiB latencies, the GPU tests)
#   cpu      the CPU engine against Hyperscan on 16 threads, OLD and BUILD
#            alternated (bench/cpu_shapes.sh: gen_shapes ids, anchors,
#            hexjump; gitleaks-regex, gitleaks-keywords, dict-15).
#            Session 30 on one thread of the development machine: ids
#            1.8-2.3x, anchors 1.8-4.6x, hexjump 3.5-3.9x, keywords
#            1.8-2.1x, gitleaks-regex 1.2-1.6x; expected about the same
#            ratios on 16 threads where a set is segmentable, and the
#            confirmed sets (ids, gitleaks-regex: one segment a buffer)
#            bound by their 1 MiB buffers spread over the threads.
#   hsdiff   test_hsdiff (every random case now also runs the CPU engine)
set -u
B=${1:?usage: h200_session30.sh BUILD OLD [steps...]}
OLD=${2:?usage: h200_session30.sh BUILD OLD [steps...]}
shift 2
WHAT=${*:-s29 cpu hsdiff}
D=$(dirname "$0")
. "$D/h200_env.sh"
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }

if has s29; then
    bash "$D/h200_session29.sh" "$B" "$OLD" restart small tests
fi
if has cpu; then
    THREADS=16 SIZE=1G ITERS=5 ROUNDS=2 timeout 400 bash "$D/cpu_shapes.sh" "$OLD" "$B"
fi
if has hsdiff; then
    timeout 300 "$B/tests/test_hsdiff" 2>&1 | tail -n 25
fi
