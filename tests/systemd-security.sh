#!/bin/sh
# systemd-security.sh SERVICE [MAX]
#
# `systemd-analyze security --offline=true` on vkscand.service as meson
# configured it: the overall exposure must be at most MAX (default 2.0;
# docs/daemon.md records the current score). Exit 77 (meson: skipped) where
# systemd-analyze is missing or too old for --offline (systemd < 250).
set -eu
service=$1 max=${2:-2.0}
if ! command -v systemd-analyze >/dev/null 2>&1; then
    echo "systemd-analyze not found: skipped"
    exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp "$service" "$dir/vkscand.service"
out=$(cd "$dir" && systemd-analyze security --offline=true --no-pager vkscand.service 2>&1) || {
    case $out in
    *"unrecognized option"*) echo "systemd-analyze has no --offline: skipped"; exit 77 ;;
    esac
}
score=$(printf '%s\n' "$out" | sed -n 's/.*Overall exposure level for vkscand.service: \([0-9.]*\).*/\1/p')
if [ -z "$score" ]; then
    printf '%s\n' "$out"
    echo "FAIL: no overall exposure level in the output"
    exit 1
fi
if awk -v s="$score" -v m="$max" 'BEGIN { exit !(s > m) }'; then
    printf '%s\n' "$out" | grep '✗' || true
    echo "FAIL: vkscand.service exposure $score is above $max"
    exit 1
fi
echo "vkscand.service exposure $score (at most $max)"
