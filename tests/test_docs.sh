#!/usr/bin/env bash
# The documentation keeps up with the code: every configuration key the daemon
# knows is in kvcached.conf(5), docs/operations.md and README.md; every kvctl
# command is in kvctl(8), docs/operations.md and the bash completion; every
# metric family daemon/metrics.c names is in docs/operations.md's table (whole,
# or as a `_suffix` on a row whose first name shares the rest); the man pages
# format without warnings (when groff is here).
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

python3 - "$src" <<'PY' || fail "metric families missing from docs/operations.md (above)"
import re, sys
src = sys.argv[1]
names = sorted(set(re.findall(r'"(kvcached_[a-z0-9_]+)', open(src + "/daemon/metrics.c").read())))
rows = [l for l in open(src + "/docs/operations.md") if l.startswith("| `kvcached_")]
def listed(m):
    for row in rows:
        toks = re.findall(r"`(_?[a-z0-9_]+)`", row.split("|")[1])
        if m in toks:
            return True
        first = toks[0]
        cuts = [first[:i] for i, ch in enumerate(first) if ch == "_"]
        if any(t.startswith("_") and m.endswith(t) and m[:-len(t)] in cuts for t in toks):
            return True
    return False
missing = [m for m in names if not listed(m)]
for m in missing:
    print("not in docs/operations.md:", m, file=sys.stderr)
if missing or len(names) < 20:
    sys.exit(1)
print("ok: %d metric families documented" % len(names))
PY

if command -v groff >/dev/null; then
	for m in "$src"/man/*.[58]; do
		out=$(groff -man -Tutf8 -ww -z "$m" 2>&1)
		[ -z "$out" ] || fail "groff warns about $m: $out"
	done
	echo "ok: man pages format without warnings"
else
	echo "groff is not here: man pages not formatted"
fi
