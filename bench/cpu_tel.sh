#!/usr/bin/env bash
# cpu_tel: the CPU engine (vkscand --engine cpu, every core) on a 256 MiB
# file of build-cpuset/default.hay: each set's telemetry (segments, read and
# scan time) for two scans, and the CPU time vkscand spent on one. Run from
# the repository root on a GPU host (session 48); B: the build (release).
set -u
B=${B:-build-s48b}
W=/tmp/tw; rm -rf $W/st; mkdir -p $W
for _ in $(seq 431); do cat build-cpuset/default.hay; done | head -c 268435456 > $W/big
$B/daemon/vkscand --config "" --socket $W/s.sock --state-dir $W/st --engine cpu --log-level notice > $W/d.log 2>&1 &
for _ in $(seq 100); do grep -q "ready on" $W/d.log && break; sleep 0.1; done
for s in gitleaks-regex leads wordy-300; do
  $B/client/vkscan --socket $W/s.sock scan -c --no-cache -r build-cpuset/$s.rules $W/big > /dev/null
  for i in 1 2; do
    VKSCAN_TELEMETRY=1 $B/client/vkscan --socket $W/s.sock scan -c --no-cache -r build-cpuset/$s.rules $W/big 2>&1 >/dev/null | tr ' ' '\n' | grep -E "^(cpu_segments|fd_read_ns|scan_ns|total_ns|client_rpc_ns)=" | tr '\n' ' '; echo " $s"
  done
done
P=$(pgrep -f "socket $W/s.sock" | head -1)
for s in gitleaks-regex leads wordy-300; do
  a=$(awk '{print $14+$15}' /proc/$P/stat); $B/client/vkscan --socket $W/s.sock scan -c --no-cache -r build-cpuset/$s.rules $W/big > /dev/null; b=$(awk '{print $14+$15}' /proc/$P/stat); echo "$s cpu_ticks $((b-a))"
done
which perf
kill $P
