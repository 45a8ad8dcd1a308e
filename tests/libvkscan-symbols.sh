#!/bin/sh
# libvkscan-symbols.sh LIB LIST [DOCS]
#
# The ABI check: the dynamic symbols libvkscan.so defines (type, name and
# version node, from `nm -D --defined-only`) must equal the checked-in LIST
# (tests/libvkscan.symbols). A symbol added, removed or moved to another
# version node fails here: update the list on purpose, in the same commit as
# the header, and say so in the change log.
# With DOCS (the docs/ directory), every exported function must also be
# named on a libvkscan*.3 manual page.
set -eu
lib=$1 list=$2 docs=${3:-}
command -v nm >/dev/null 2>&1 || { echo "nm not found: skipped"; exit 77; }
got=$(LC_ALL=C nm -D --defined-only "$lib" | awk '{print $2, $3}' | LC_ALL=C sort -k2)
if ! printf '%s\n' "$got" | diff -u "$list" -; then
    echo "FAIL: the symbols $lib exports differ from $list (- expected, + built)"
    exit 1
fi
echo "libvkscan exports the $(wc -l <"$list") symbols of $list"
if [ -n "$docs" ]; then
    missing=""
    for fn in $(sed -n 's/^T \([a-z_]*\)@.*/\1/p' "$list"); do
        # roff may escape the underscores' neighbours, but not the name itself.
        cat "$docs"/libvkscan*.3 | grep -q "$fn" || missing="$missing $fn"
    done
    if [ -n "$missing" ]; then
        echo "FAIL: not on any docs/libvkscan*.3 page:$missing"
        exit 1
    fi
    echo "every exported function is on a docs/libvkscan*.3 page"
fi
