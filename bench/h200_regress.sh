#!/usr/bin/env bash
# Session 10: the literal sets' kernel against the build before the
# queued hit writer (BUILD_PREV), in one call, twice each, to tell a
# change from the device's run-to-run variation.
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
# the device runs slower for its first seconds of a call: warm it first
build-rel/bench/scan_bench --data build-shared --iters 3 --size 1G --buffer 1048576 \
    --only literals-1000 --no-hs >/dev/null 2>&1
for round in ${ROUNDS:-1 2}; do
  for b in ${BUILDS:-build-prev build-rel}; do
    $b/bench/scan_bench --data build-shared --iters 5 --size 1G --buffer 1048576 \
      --only ${ONLY:-literals-1000,literals-10000,gitleaks-keywords,phrases-3k} > $OUT/r$round-$b.txt 2>&1
    echo "round $round $b"; grep -A5 '^median' $OUT/r$round-$b.txt | grep -v median
  done
done
