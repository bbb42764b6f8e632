#!/usr/bin/env bash
# The example alerting rules (docs/alerts/kvcached.rules.yml) load in
# Prometheus: `promtool check rules` finds no error, and every metric they
# name is one the daemon exports (kvctl metrics' families). Skips (77)
# without promtool.
set -euo pipefail
command -v promtool >/dev/null || { echo "skip: no promtool"; exit 77; }
src=${MESON_SOURCE_ROOT:-$(dirname "$0")/..}
rules=$src/docs/alerts/kvcached.rules.yml
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$(promtool check rules "$rules" 2>&1) || fail "promtool check rules: $out"
grep -q "SUCCESS: 7 rules found" <<<"$out" || fail "promtool: $out"
echo "ok: promtool check rules: $(echo "$out" | tail -1)"

# The metric names in the expressions exist in the daemon's exposition.
dir=$(mktemp -d /tmp/kvt-alerts.XXXXXX)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
"$KVCACHED_BIN" --config= --socket="$dir/s" --pool-size=16MiB --segment-size=4MiB \
	>"$dir/log" 2>&1 &
pid=$!
for _ in $(seq 500); do [ -S "$dir/s-admin.sock" ] && break; sleep 0.02; done
"$KVCTL_BIN" -s "$dir/s-admin.sock" metrics > "$dir/m" || fail "kvctl metrics"
families=$(sed -n 's/^# TYPE \([^ ]*\) .*/\1/p' "$dir/m")
# Here-strings, not `echo | grep -q`: under pipefail a grep that exits at
# its first match can fail the writer with SIGPIPE.
for m in $(grep -o 'kvcached_[a-z_]*' "$rules" | sort -u); do
	base=${m%_bucket}
	grep -qx "$base" <<<"$families" ||
		fail "the rules name $m, which the daemon does not export; its exposition" \
		     "($(wc -c < "$dir/m") bytes) has: $(tr '\n' ' ' <<<"$families"); its log: $(cat "$dir/log")"
done
echo "ok: every metric the rules name is exported"
