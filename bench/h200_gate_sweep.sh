for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
B=build-rel
for T in 24 20; do for G in 4096 256 64 1; do
  timeout 120 $B/bench/scan_bench --data build-shared --iters 5 --size 1G --buffer 1048576 --only regex-500,gitleaks-regex --gate-rare-bits $T --gated-group-bits $G > $OUT/s_${T}_$G.txt 2>&1
  echo "T=$T G=$G rc=$?"; grep -A3 "^median" $OUT/s_${T}_$G.txt | tail -2; grep -A3 "^telemetry" $OUT/s_${T}_$G.txt | tail -2 | awk '{print "   ", $1, "fac", $3, "kern", $6, "launch", $13}'; grep -E " no$" $OUT/s_${T}_$G.txt
done; done
