#!/usr/bin/env bash
# The systemd units: `systemd-analyze verify` finds nothing to say about them,
# and `systemd-analyze security` rates kvcached.service at 2.5 or better.
#
# systemd is not PID 1 here, and the installed ExecStart path does not exist
# in a build tree, so this verifies copies in a scratch directory with
# ExecStart pointing at the kvcached just built (the only change). Verify runs
# offline (--man=no; unknown users such as User=kvcached do not fail it).
# Skips (77) without systemd-analyze.
set -euo pipefail
command -v systemd-analyze >/dev/null || { echo "skip: no systemd-analyze"; exit 77; }
src=${MESON_SOURCE_ROOT:-$(dirname "$0")/..}/systemd
[ -x "$KVCACHED_BIN" ] || { echo "KVCACHED_BIN not set"; exit 1; }

dir=$(mktemp -d /tmp/kvt-units.XXXXXX)
trap 'rm -rf "$dir"' EXIT
sed "s|@sbindir@/kvcached|$KVCACHED_BIN|" "$src/kvcached.service.in" > "$dir/kvcached.service"
cp "$src/kvcached.socket" "$src/kvcached-admin.socket" "$src/kvcached-metrics.socket" "$dir/"
grep -q "^ExecStart=$KVCACHED_BIN\$" "$dir/kvcached.service"

fail() { echo "FAIL: $*" >&2; exit 1; }
cd "$dir"
out=$(systemd-analyze verify --man=no kvcached.service kvcached.socket \
	kvcached-admin.socket kvcached-metrics.socket 2>&1) || fail "verify: $out"
[ -z "$out" ] || fail "verify has something to say: $out"
echo "ok: systemd-analyze verify"

# A broken copy must fail, or this test proves nothing.
sed 's|^Type=notify|Type=notify\nFrobnicate=yes|; s|^ExecStart=.*|ExecStart=/nonexistent/kvcached|' \
	kvcached.service > broken.service
if systemd-analyze verify --man=no broken.service >/dev/null 2>&1; then
	fail "verify accepts a broken unit"
fi
rm broken.service

if systemd-analyze security --help 2>&1 | grep -q -- --offline; then
	report=$(systemd-analyze security --offline=true --no-pager kvcached.service 2>&1) ||
		fail "security: $report"
	echo "$report" | tail -1
	# --threshold is in tenths: 25 = 2.5.
	systemd-analyze security --offline=true --threshold=25 kvcached.service >/dev/null 2>&1 ||
		fail "exposure above 2.5: $(echo "$report" | tail -1)"
	echo "ok: exposure at most 2.5"
else
	echo "systemd-analyze security --offline is not in this systemd; exposure not checked"
fi

# Every key the daemon knows is in the example configuration, commented out
# at its default (the computed defaults are left empty there).
"$KVCACHED_BIN" --config= --socket=/run/kvcached/kvcached.sock --print-config |
	sed -n 's/^\([a-z_]*\) =\(.*\)/\1\2/p' > keys
while read -r k v; do
	# The [kvcached] section's line: a namespace section below may show the
	# same key (remote_auth) in an example of its own.
	line=$(sed '/^#\[namespace /,$d' "$src/kvcached.conf" | grep "^#$k =") ||
		fail "$k is not in systemd/kvcached.conf's [kvcached] section"
	case $k in socket|admin_socket|segment_size) continue ;; esac
	[ "$line" = "#$k =${v:+ $v}" ] || fail "systemd/kvcached.conf: '$line', default is '$v'"
done < keys
echo "ok: the example configuration has every key at its default"
