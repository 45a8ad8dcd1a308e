#!/bin/sh
# systemd-verify.sh SERVICE SOCKET VKSCAND SYSUSERS TMPFILES
#
# Checks the systemd files as meson configured them:
# - `systemd-analyze verify` on vkscand.service and vkscand.socket. ExecStart=
#   names the installed path, which need not exist yet, so the copy verified
#   here points at the vkscand just built. Any complaint about our units fails.
# - as root, systemd-sysusers and systemd-tmpfiles applied to an empty root:
#   the vkscand user and vkscan group and the directories must come out.
#   ExecStart= passes no --config: vkscand reads its default config file
#   when it exists.
# Exit 77 (meson: skipped) without systemd-analyze.
set -eu
service=$1 socket=$2 sysusers=$4 tmpfiles=$5
vkscand=$(readlink -f "$3")
if ! command -v systemd-analyze >/dev/null 2>&1; then
    echo "systemd-analyze not found: skipped"
    exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}

grep -q '^ExecStart=/[^ ]*/vkscand$' "$service" ||
    fail "$service: ExecStart= is not '/.../vkscand' (the default config file needs no flag)"
mkdir "$dir/units"
sed "s|^ExecStart=[^ ]*|ExecStart=$vkscand|" "$service" >"$dir/units/vkscand.service"
cp "$socket" "$dir/units/vkscand.socket"
out=$(cd "$dir/units" && SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no \
    "$dir/units/vkscand.socket" "$dir/units/vkscand.service" 2>&1) || {
    printf '%s\n' "$out"
    fail "systemd-analyze verify exited non-zero"
}
# Lines about other units of this host, or about running without systemd as
# PID 1, are not ours: only lines naming our units count.
ours=$(printf '%s\n' "$out" | grep 'vkscand\.' || true)
if [ -n "$ours" ]; then
    printf '%s\n' "$ours"
    fail "systemd-analyze verify complained about the vkscand units"
fi
echo "systemd-analyze verify: vkscand.service and vkscand.socket are clean"

# tmpfiles chowns to the new user: that part needs root (CI runs as root).
if [ "$(id -u)" -ne 0 ]; then
    echo "not root: sysusers.d and tmpfiles.d entries not applied"
elif command -v systemd-sysusers >/dev/null 2>&1 && command -v systemd-tmpfiles >/dev/null 2>&1; then
    root=$dir/root
    mkdir -p "$root/etc"
    : >"$root/etc/passwd"
    : >"$root/etc/group"
    systemd-sysusers --root="$root" "$sysusers" >/dev/null 2>&1 || fail "systemd-sysusers $sysusers"
    grep -q '^vkscand:' "$root/etc/passwd" || fail "sysusers made no vkscand user"
    grep -q '^vkscan:' "$root/etc/group" || fail "sysusers made no vkscan group"
    gid=$(sed -n 's/^vkscan:[^:]*:\([0-9]*\):.*/\1/p' "$root/etc/group")
    grep -q "^vkscand:[^:]*:[0-9]*:$gid:" "$root/etc/passwd" ||
        fail "vkscand's primary group is not vkscan"
    systemd-tmpfiles --root="$root" --create "$tmpfiles" || fail "systemd-tmpfiles $tmpfiles"
    for d in /run/vkscand /var/lib/vkscand; do
        [ -d "$root$d" ] || fail "tmpfiles made no $d"
    done
    echo "sysusers.d and tmpfiles.d entries apply"
fi
