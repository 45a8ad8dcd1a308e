# Sourced by the H200 scripts: unpacks the runtime debs carried in .gl
# (docs: ../shared/GPU.md) and points the loader at the NVIDIA ICD.
OUT=${OUT:-/tmp/vks-out}
mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done
ldconfig
for f in .gl/extra/*.deb; do dpkg -x "$f" /opt/vks-extra >/dev/null 2>&1; done
export LD_LIBRARY_PATH=/opt/vks-extra/usr/lib/x86_64-linux-gnu
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
