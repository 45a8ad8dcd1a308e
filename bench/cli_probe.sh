#!/usr/bin/env bash
# cli_probe: where a 1 GiB `vkscan scan -c` spends its time on the H200. Runs
# vkscand (default config) and three scans per rule set with VKSCAN_TELEMETRY,
# printing the telemetry keys that split the time.
#   bench/cli_probe.sh BUILD DATA   (DATA: *.rules sets named below, default.hay)
# Scans pass --no-cache: an unchanged file's rescan would come from vkscand's
# result cache.
B=$1; D=$2
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done; ldconfig
for f in .gl/extra/*.deb; do dpkg -x "$f" /opt/vks-extra >/dev/null 2>&1; done
export LD_LIBRARY_PATH=/opt/vks-extra/usr/lib/x86_64-linux-gnu
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
mkdir -p /tmp/p; for i in $(seq 1800); do cat $D/default.hay; done | head -c 1073741824 > /tmp/p/big
cat /tmp/p/big > /dev/null
$B/daemon/vkscand --config "" --socket /tmp/p/s.sock --state-dir /tmp/p/st --log-level notice > /tmp/p/d.log 2>&1 &
daemon=$!
for _ in $(seq 300); do grep -q "ready on" /tmp/p/d.log && break; sleep 0.1; done
cat /tmp/p/d.log
for r in dict-10 gitleaks-keywords; do
  for i in 1 2 3; do
    s=$(date +%s.%N); VKSCAN_TELEMETRY=1 $B/client/vkscan --socket /tmp/p/s.sock scan -c --no-cache -r $D/$r.rules /tmp/p/big 2>&1 >/dev/null | grep -o "engine=.*" | tr ' ' '\n' | grep -E "^(engine|wall_ns|fd_read_ns|upload_ns|run_ns|readback_ns|scan_ns|total_ns|queue_ns|plan_ns|cpu_retry|batch_bytes)=" | tr '\n' ' '; e=$(date +%s.%N); echo " $r wall $(awk -v a=$s -v b=$e 'BEGIN{print b-a}')"
  done
done
# Warm restart: the pipeline cache file and the disk catalog cache are in
# place; time from start to "ready" and the first scan's telemetry.
kill -TERM $daemon; wait $daemon
s=$(date +%s.%N)
$B/daemon/vkscand --config "" --socket /tmp/p/s.sock --state-dir /tmp/p/st --log-level notice > /tmp/p/d2.log 2>&1 &
daemon=$!
for _ in $(seq 3000); do grep -q "ready on" /tmp/p/d2.log && break; sleep 0.01; done
e=$(date +%s.%N); echo "restart: ready after $(awk -v a=$s -v b=$e 'BEGIN{print b-a}') s"
for r in dict-10 gitleaks-keywords; do
  s=$(date +%s.%N); VKSCAN_TELEMETRY=1 $B/client/vkscan --socket /tmp/p/s.sock scan -c --no-cache -r $D/$r.rules /tmp/p/big 2>&1 >/dev/null | grep -o "engine=.*" | tr ' ' '\n' | grep -E "^(plan_ns|fd_read_ns|scan_ns|total_ns|pipeline_compiles|catalog_uploads)=" | tr '\n' ' '; e=$(date +%s.%N); echo " first after restart: $r wall $(awk -v a=$s -v b=$e 'BEGIN{print b-a}')"
done
kill -TERM $daemon; wait $daemon
