#!/bin/sh
# package-test.sh DIR: checks the .deb files dpkg-buildpackage left in DIR
# (./dev package runs it; it is not part of ./dev test: building the packages
# takes minutes on two cores).
#
# - the five packages exist and install, unpacked with dpkg --root into an
#   empty root with its own dpkg database (no maintainer script runs there);
# - dpkg -L lists each package's files where they belong;
# - systemd-analyze verify accepts the installed units, pointed at the
#   installed vkscand, and the service still scores <= 2.0 on
#   systemd-analyze security;
# - vkscand's postinst only applies sysusers.d and tmpfiles.d and enables the
#   socket (debhelper snippets): it neither enables nor starts the service.
set -eu
dir=$(readlink -f "$1")
here=$(dirname "$(readlink -f "$0")")
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}
debs=""
for p in vkscand vkscan libvkscan0 libvkscan-dev python3-vkscan; do
    f=$(ls "$dir"/${p}_*.deb 2>/dev/null | head -n1)
    [ -n "$f" ] || fail "no ${p}_*.deb in $dir"
    debs="$debs $f"
done
mkdir -p "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/info"
: >"$root/var/lib/dpkg/status"
# --unpack runs no postinst; preinst would run chrooted, and none exists.
for f in $debs; do
    dpkg-deb -e "$f" "$root/ctl" && [ ! -e "$root/ctl/preinst" ] || fail "$f has a preinst"
    rm -rf "$root/ctl"
done
dpkg --root="$root" --force-depends --force-not-root --force-script-chrootless \
    --unpack $debs >/dev/null || fail "dpkg --unpack into $root"

has() { # has PACKAGE PATH
    dpkg --root="$root" -L "$1" | grep -qx "$2" || fail "dpkg -L $1 lacks $2"
}
has vkscand /usr/sbin/vkscand
has vkscand /lib/systemd/system/vkscand.service
has vkscand /lib/systemd/system/vkscand.socket
has vkscand /usr/lib/sysusers.d/vkscand.conf
has vkscand /usr/lib/tmpfiles.d/vkscand.conf
has vkscand /usr/share/man/man8/vkscand.8.gz
has vkscan /usr/bin/vkscan
has vkscan /usr/share/man/man1/vkscan.1.gz
dpkg --root="$root" -L libvkscan0 | grep -q '^/usr/lib/.*/libvkscan\.so\.0$' ||
    fail "dpkg -L libvkscan0 lacks libvkscan.so.0"
has libvkscan-dev /usr/include/vkscan/vkscan.h
has libvkscan-dev /usr/share/man/man3/libvkscan.3.gz
dpkg --root="$root" -L libvkscan-dev | grep -q '/pkgconfig/vkscan\.pc$' || fail "no vkscan.pc"
has python3-vkscan /usr/lib/python3/dist-packages/vkscan/__init__.py
dpkg --root="$root" -L python3-vkscan | grep -q '/vkscan/_vkscan\..*\.so$' || fail "no _vkscan"
echo "dpkg -L: every package holds its files"

# The installed binaries run (libvkscan from the unpacked root).
lib=$(dirname "$(dpkg --root="$root" -L libvkscan0 | grep 'libvkscan\.so\.0$')")
"$root/usr/sbin/vkscand" --check-config --config "" >/dev/null || fail "vkscand --check-config"
LD_LIBRARY_PATH="$root$lib" "$root/usr/bin/vkscan" --help >/dev/null 2>&1 ||
    LD_LIBRARY_PATH="$root$lib" "$root/usr/bin/vkscan" rules --help >/dev/null 2>&1 ||
    fail "vkscan does not run"
if command -v /usr/bin/python3 >/dev/null; then
    LD_LIBRARY_PATH="$root$lib" PYTHONPATH="$root/usr/lib/python3/dist-packages" \
        /usr/bin/python3 -c 'import vkscan; assert vkscan.library_version()' ||
        fail "python3 cannot import the packaged vkscan"
fi

# The units as installed.
if command -v systemd-analyze >/dev/null; then
    sh "$here/systemd-verify.sh" "$root/lib/systemd/system/vkscand.service" \
        "$root/lib/systemd/system/vkscand.socket" "$root/usr/sbin/vkscand" \
        "$root/usr/lib/sysusers.d/vkscand.conf" "$root/usr/lib/tmpfiles.d/vkscand.conf" ||
        fail "systemd-verify.sh on the installed units"
    sh "$here/systemd-security.sh" "$root/lib/systemd/system/vkscand.service" 2.0 ||
        fail "systemd-analyze security on the installed service"
fi

# postinst: debhelper's snippets only.
post="$root/var/lib/dpkg/info/vkscand.postinst"
[ -f "$post" ] || fail "vkscand has no postinst"
grep -q 'systemd-sysusers' "$post" || fail "postinst does not apply sysusers.d"
grep -q 'systemd-tmpfiles' "$post" || fail "postinst does not apply tmpfiles.d"
grep -q "deb-systemd-helper.* enable 'vkscand.socket'" "$post" ||
    grep -q 'enable.*vkscand\.socket' "$post" || fail "postinst does not enable vkscand.socket"
# First installations enable only the units named after debhelper's
# "was-enabled defaults to true" line; nothing starts the service.
firstenable=$(grep -A1 'was-enabled defaults to true' "$post" | grep -o "was-enabled '[^']*'" || true)
[ "$firstenable" = "was-enabled 'vkscand.socket'" ] ||
    fail "postinst enables on installation: $firstenable (only vkscand.socket)"
if grep -q "deb-systemd-invoke.*vkscand\.service" "$post"; then
    fail "postinst starts vkscand.service (socket activation starts it)"
fi
if grep -v '^#' "$post" | grep -q 'Automatically added by' && \
   [ "$(grep -c '^# Automatically added by' "$post")" -ne "$(grep -c '^# End automatically added section' "$post")" ]; then
    fail "postinst has unbalanced debhelper sections"
fi
outside=$(awk '/^# Automatically added by/{inside=1} !inside && !/^(#|set -e|$)/ {print} /^# End automatically added section/{inside=0}' "$post")
[ -z "$outside" ] || fail "postinst does more than debhelper's snippets: $outside"
echo "postinst: sysusers, tmpfiles and the socket only"
echo "packages OK"
