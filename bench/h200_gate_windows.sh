for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for w in 0 1; do
  build-rel/bench/scan_bench --data build-shared --iters 5 --size 1G --buffer 1048576 --only regex-500,gitleaks-regex,regex-500-secrets --gate-windows $w > $OUT/gw$w.txt 2>&1
  echo "gate-windows $w"; grep -A4 '^median' $OUT/gw$w.txt; grep -A4 '^telemetry' $OUT/gw$w.txt; grep -A4 '^workload' $OUT/gw$w.txt | cut -c1-130
done
