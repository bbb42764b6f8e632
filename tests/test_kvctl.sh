#!/usr/bin/env bash
# kvctl against a live daemon with a worker holding blocks: every command in
# human and JSON output (the JSON parsed), errors as one line and exit codes.
# Needs KVCACHED_BIN, KVCTL_BIN, KVDEMO_BIN (meson sets them) and python3.
set -euo pipefail
command -v python3 >/dev/null || { echo "skip: no python3"; exit 77; }

dir=$(mktemp -d /tmp/kvt-kvctl.XXXXXX)
export KVCACHED_SOCKET=$dir/kvcached.sock
"$KVCACHED_BIN" --config= --pool-size 256MiB --segment-size 64MiB 2>"$dir/log" &
pid=$!
trap 'kill -9 $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 200); do "$KVCTL_BIN" status >/dev/null 2>&1 && break; sleep 0.05; done

fail() { echo "FAIL: $*" >&2; cat "$dir/log" >&2; exit 1; }

# Some state to look at: the demo leaves cached blocks behind.
"$KVDEMO_BIN" >/dev/null || fail "kvdemo"

for cmd in status pools clients check; do
	out=$("$KVCTL_BIN" "$cmd") || fail "kvctl $cmd"
	[ -n "$out" ] || fail "kvctl $cmd printed nothing"
	"$KVCTL_BIN" -o json "$cmd" > "$dir/$cmd.json" || fail "kvctl -o json $cmd"
	"$KVCTL_BIN" "$cmd" --help >/dev/null || fail "kvctl $cmd --help"
done

python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
def load(n):
    with open(f"{d}/{n}.json") as f:
        return json.load(f)
st, pools, clients, check = load("status"), load("pools"), load("clients"), load("check")
def find_pools(x):
    return x["pools"] if isinstance(x, dict) and "pools" in x else x
ps = find_pools(pools)
assert isinstance(ps, list) and len(ps) >= 1, pools
p = [p for p in ps if p["name"] == "llama-3-8b"]
assert p, ps
p = p[0]
assert p["blocks_cached"] > 0 and p["blocks_writable"] == 0, p
assert check["ok"] is True, check
cl = clients["clients"] if isinstance(clients, dict) else clients
assert isinstance(cl, list) and len(cl) >= 1, clients   # kvctl itself
assert any(c.get("name") == "kvctl" for c in cl), cl
assert "backend" in json.dumps(st), st
print("json ok:", len(ps), "pools,", p["blocks_cached"], "cached blocks")
PY

# Errors: one line on stderr and a non-zero exit code.
set +e
err=$("$KVCTL_BIN" -s "$dir/nope.sock" status 2>&1 >/dev/null); rc=$?
set -e
[ "$rc" -eq 1 ] || fail "unreachable daemon: exit $rc"
[ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] || fail "error is not one line: $err"
set +e
"$KVCTL_BIN" frobnicate >/dev/null 2>&1; rc=$?
set -e
[ "$rc" -eq 2 ] || fail "unknown command: exit $rc"

kill -TERM $pid
wait $pid || fail "daemon exit status $?"
echo "kvctl ok"
