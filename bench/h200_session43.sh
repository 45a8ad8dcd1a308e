#!/usr/bin/env bash
# Session 43's GPU-host calls. Carry .gl, build-shared and build-s42 (slim
# release builds, build-data, build-gated), linked into the tree by the
# command (for d in build-s42/*; do ln -sfn $d .; done).
#   [OLD=b] bench/h200_session43.sh NEW [steps...]
#   steps: cpu (scan_bench, CPU engine on 16 threads against Hyperscan on
#   16 threads, every workload of build-shared, 16 MiB buffers, OLD then
#   NEW), where (h200_session42.sh's where: OLD, WHERE_DATA, WHERE_SETS),
#   cli (h200_session41.sh's cli_bench of NEW). Default: cpu.
set -u
NEW=${1:?usage: h200_session43.sh NEW [steps...]}
shift
WHAT=${*:-cpu}
has() { case " $WHAT " in *" $1 "*) return 0 ;; esac; return 1; }
D=$(dirname "$0")
. "$D/h200_env.sh"
if has where; then
    OLD=${WHERE_OLD:-} bash "$D/h200_session42.sh" "$NEW" where
fi
if has cpu; then
    for b in ${OLD:-} "$NEW"; do
        echo "== scan_bench --engine cpu $b ($(date +%T))"
        timeout ${CPU_S:-150} "$b/bench/scan_bench" --engine cpu --threads 16 --size ${CPU_SIZE:-256M} \
            --buffer 16M --iters 3 --warm-ms 0 --data build-shared 2>&1 | tail -n 12
    done
fi
if has cli; then
    bash "$D/h200_session41.sh" "$NEW" cli
fi
echo "== done ($(date +%T))"
