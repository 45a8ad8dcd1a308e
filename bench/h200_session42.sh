#!/usr/bin/env bash
# Session 42's GPU-host calls. Carry .gl, build-shared and build-s42 (slim
# release builds, build-data, build-gated, sets-dense, sets-sparse); the
# command links build-s42/* into the tree first.
#   [OLD="b1 b2"] bench/h200_session42.sh BUILD [steps...]
#   steps: where (bench/h200_session41.sh's where, for OLD and BUILD),
#   buf1g (scan_bench, one 1 GiB buffer of literals-1000, Hyperscan on 16
#   threads in the same run, for OLD and BUILD), diff (h200_session41.sh's
#   diff of BUILD), cli (h200_session41.sh's cli_bench of BUILD against
#   Hyperscan on both data folders). Default: where buf1g.
set -u
BUILD=${1:?usage: h200_session42.sh BUILD [steps...]}
shift
WHAT=${*:-where buf1g}
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
D=$(dirname "$0")
if has where; then
    bash "$D/h200_session41.sh" "$BUILD" where
fi
if has buf1g; then
    . "$D/h200_env.sh"
    for b in ${OLD:-} "$BUILD"; do
        echo "== scan_bench $b literals-1000 1 GiB buffer ($(date +%T))"
        timeout 120 "$b/bench/scan_bench" --size 1G --buffer 1G --iters 5 --threads 16 \
            --data build-shared --only literals-1000 2>&1 | grep -E "^literals-1000|^workload"
    done
fi
if has cli; then
    bash "$D/h200_session41.sh" "$BUILD" cli
fi
if has diff; then
    bash "$D/h200_session41.sh" "$BUILD" diff
fi
echo "== done ($(date +%T))"
