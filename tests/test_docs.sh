#!/usr/bin/env bash
# The documentation keeps up with the code: every configuration key the daemon
# knows is in kvcached.conf(5), docs/operations.md and README.md; every kvctl
# command is in kvctl(8), docs/operations.md and the bash completion; the man
# pages format without warnings (when groff is here).
set -euo pipefail
src=${MESON_SOURCE_ROOT:-$(dirname "$0")/..}
fail() { echo "FAIL: $*" >&2; exit 1; }

keys=$("$KVCACHED_BIN" --config= --socket=/run/kvcached/kvcached.sock --print-config |
	sed -n 's/^\([a-z_]*\) =.*/\1/p')
[ "$(echo "$keys" | wc -l)" -ge 10 ] || fail "no keys from --print-config"
for k in $keys; do
	grep -q "^\.BR $k " "$src/man/kvcached.conf.5" || fail "$k is not in man/kvcached.conf.5"
	grep -q "^|.*\`$k\`" "$src/docs/operations.md" || fail "$k is not in docs/operations.md"
	grep -q "^|.*\`$k\`" "$src/README.md" || fail "$k is not in README.md"
done
echo "ok: $(echo "$keys" | wc -w) keys documented"

cmds=$("$KVCTL_BIN" --help | sed -n '/^Commands:/,/^$/s/^  \([a-z]*\) .*/\1/p')
[ -n "$cmds" ] || fail "no commands from kvctl --help"
for c in $cmds; do
	grep -q "^\.B $c\b" "$src/man/kvctl.8" || fail "$c is not in man/kvctl.8"
	grep -q "kvctl $c" "$src/docs/operations.md" || fail "$c is not in docs/operations.md"
	grep -q "commands=.*\b$c\b" "$src/client/kvctl.bash" || fail "$c is not in client/kvctl.bash"
done
echo "ok: kvctl commands documented:" $cmds

if command -v groff >/dev/null; then
	for m in "$src"/man/*.[58]; do
		out=$(groff -man -Tutf8 -ww -z "$m" 2>&1)
		[ -z "$out" ] || fail "groff warns about $m: $out"
	done
	echo "ok: man pages format without warnings"
else
	echo "groff is not here: man pages not formatted"
fi
