#!/usr/bin/env bash
# kvctl against a live daemon with workers holding blocks: every command in
# human and JSON output (the JSON parsed), --help and `help` for each, the
# metrics checked against the Prometheus text format, top in plain and JSON
# frames, evict, reload, drain; errors as one line and exit codes.
# Needs KVCACHED_BIN, KVCTL_BIN, KVDEMO_BIN, KVT_WORKER_BIN (meson sets them)
# and python3.
set -euo pipefail
command -v python3 >/dev/null || { echo "skip: no python3"; exit 77; }

dir=$(mktemp -d /tmp/kvt-kvctl.XXXXXX)
export KVCACHED_SOCKET=$dir/kvcached.sock
unset KVCACHED_ADMIN_SOCKET
"$KVCACHED_BIN" --config= --pool-size 256MiB --segment-size 64MiB 2>"$dir/log" &
pid=$!
trap 'kill -9 $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 200); do "$KVCTL_BIN" status >/dev/null 2>&1 && break; sleep 0.05; done

fail() { echo "FAIL: $*" >&2; cat "$dir/log" >&2; exit 1; }

# Some state to look at: the demo leaves cached blocks behind, and a worker
# in another namespace holds blocks of a pool whose name needs escaping.
"$KVDEMO_BIN" >/dev/null || fail "kvdemo"
coproc W { "$KVT_WORKER_BIN" "$KVCACHED_SOCKET" tenant-b; }
# bash unsets W_PID (and W) once it has reaped the coprocess, which may be
# before the `wait` below: keep the pid.
w_pid=$W_PID
ask() { echo "$1" >&"${W[1]}"; read -r reply <&"${W[0]}"; echo "$reply"; }
read -r hello <&"${W[0]}"
[[ $hello == ready* ]] || fail "worker: $hello"
[[ $(ask 'pool we"ird\name 65536') == ok* ]] || fail "worker pool"
[[ $(ask "alloc 3") == "ok 3" ]] || fail "worker alloc"

# kvctl talks to the admin socket next to $KVCACHED_SOCKET by default.
[ -S "$dir/kvcached-admin.sock" ] || fail "no admin socket next to the worker socket"

for cmd in status pools clients check metrics; do
	out=$("$KVCTL_BIN" "$cmd") || fail "kvctl $cmd"
	[ -n "$out" ] || fail "kvctl $cmd printed nothing"
	"$KVCTL_BIN" -o json "$cmd" > "$dir/$cmd.json" || fail "kvctl -o json $cmd"
	"$KVCTL_BIN" "$cmd" -o json > "$dir/$cmd.2.json" || fail "kvctl $cmd -o json"
done
"$KVCTL_BIN" metrics > "$dir/metrics.txt"
for cmd in status pools clients evict flush drain reload check metrics top; do
	"$KVCTL_BIN" "$cmd" --help | grep -q "^Usage: kvctl .* $cmd" || fail "kvctl $cmd --help"
	"$KVCTL_BIN" help "$cmd" | grep -q "^Usage: kvctl .* $cmd" || fail "kvctl help $cmd"
done
# kvctl events without --endpoint asks the admin socket for the publisher's
# counters: this daemon publishes none, which is one line and exit 1; its
# stream options need --endpoint (a usage error, 2).
set +e
out=$("$KVCTL_BIN" events 2>&1); rc=$?
"$KVCTL_BIN" events --topic x >/dev/null 2>&1; rc2=$?
set -e
[ $rc -eq 1 ] && [[ $out == "kvctl: events: the daemon publishes no KV events"* ]] ||
	fail "kvctl events without events: rc $rc: $out"
[ $rc2 -eq 2 ] || fail "kvctl events --topic without --endpoint: rc $rc2"
"$KVCTL_BIN" --help | grep -q "^Commands:" || fail "kvctl --help"
"$KVCTL_BIN" help | grep -q "^Commands:" || fail "kvctl help"

# top: plain frames when not a terminal, JSON lines with -o json.
"$KVCTL_BIN" top -n 2 -d 0.2 > "$dir/top.txt" || fail "kvctl top"
[ "$(grep -c '^kvctl top' "$dir/top.txt")" -eq 2 ] || fail "top: not 2 frames"
if grep -q $'\033' "$dir/top.txt"; then fail "top wrote escape codes to a pipe"; fi
"$KVCTL_BIN" -o json top -n 3 -d 0.1 > "$dir/top.jsonl" || fail "kvctl -o json top"

python3 - "$dir" <<'PY'
import json, re, sys
d = sys.argv[1]
def load(n):
    with open(f"{d}/{n}.json") as f:
        return json.load(f)
st, pools, clients, check = load("status"), load("pools"), load("clients"), load("check")
for n in ("status", "pools", "clients", "check", "metrics"):
    assert load(n + ".2") .keys() == load(n).keys(), n
ps = pools["pools"]
p = [p for p in ps if p["name"] == "llama-3-8b"][0]
assert p["blocks_cached"] > 0 and p["blocks_writable"] == 0, p
q = [p for p in ps if p["namespace"] == "tenant-b"][0]
assert q["name"] == 'we"ird\\name' and q["blocks_writable"] == 3, q
assert check["ok"] is True, check
cl = clients["clients"]
assert any(c["name"] == "kvctl" and c["socket"] == "admin" for c in cl), cl
assert any(c["name"] == "kvt_worker" and c["refs"] == 3 and c["socket"] == "worker"
           for c in cl), cl
assert st["state"] == "serving" and st["backend"] == "host" and st["clients"] == 1, st
ns = {n["name"]: n for n in st["namespaces"]}
assert ns["tenant-b"]["blocks_writable"] == 3 and ns["tenant-b"]["bytes"] == 3 * 65536, ns

# The Prometheus text format (0.0.4): HELP and TYPE once per family, before
# its samples; names and labels well formed, label values escaped.
name_re = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
label_re = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*"'
sample_re = re.compile(r"^(%s)(?:\{(%s(?:,%s)*)?\})? (\S+)$" % (name_re, label_re, label_re))
helps, types, samples = set(), {}, []
text = open(f"{d}/metrics.txt").read()
assert text.endswith("\n")
for line in text.splitlines():
    if line.startswith("# HELP "):
        name = line.split(" ")[2]
        assert re.fullmatch(name_re, name) and name not in helps, line
        helps.add(name)
    elif line.startswith("# TYPE "):
        _, _, name, typ = line.split(" ")
        assert name in helps and name not in types, line
        assert typ in ("counter", "gauge", "histogram"), line
        assert typ != "counter" or name.endswith("_total"), line
        types[name] = typ
    else:
        m = sample_re.match(line)
        assert m, "bad sample line: %r" % line
        fam = re.sub(r"_(bucket|sum|count)$", "", m.group(1))
        assert m.group(1) in types or types.get(fam) == "histogram", \
            "sample before its TYPE: %r" % line
        float(m.group(3))
        samples.append(line)
for want in ("kvcached_pages", "kvcached_pages_free", "kvcached_pool_blocks",
             "kvcached_pool_allocs_total", "kvcached_pool_lookups_total", "kvcached_pool_hits_total",
             "kvcached_pool_evictions_total", "kvcached_pool_dedups_total", "kvcached_requests_total",
             "kvcached_enospc_total", "kvcached_sessions", "kvcached_uptime_seconds",
             "kvcached_namespace_bytes", "kvcached_namespace_blocks", "kvcached_tier_blocks",
             "kvcached_tier_promotions_total"):
    assert want in types, want
assert 'name="we\\"ird\\\\name"' in text, "label escaping"
assert 'kvcached_namespace_bytes{namespace="tenant-b"} 196608' in text
# metrics -o json: the same figures, from the Stats reply (not the text).
mj = load("metrics")
assert mj.keys() == st.keys(), (mj.keys(), st.keys())
assert any(p["name"] == 'we"ird\\name' and p["blocks_writable"] == 3 for p in mj["pools"])
assert {n["name"] for n in mj["namespaces"]} == set(ns)

frames = [json.loads(l) for l in open(f"{d}/top.jsonl")]
assert len(frames) == 3 and all("pools" in f and "clients" in f for f in frames), frames
print("json ok:", len(ps), "pools,", len(samples), "samples,", len(frames), "top frames")
PY

# evict: one pool, then all; the worker's held blocks stay.
pool=$(python3 -c 'import json,sys; print([p["pool_id"] for p in json.load(sys.stdin)["pools"] if p["name"] == "llama-3-8b"][0])' < "$dir/pools.json")
n=$("$KVCTL_BIN" -o json evict --pool "$pool" | python3 -c 'import json,sys; j=json.load(sys.stdin); assert j["tier"] == "G1"; print(j["blocks"])')
[ "$n" -gt 0 ] || fail "evict --pool $pool evicted $n"
"$KVCTL_BIN" evict --all | grep -q "^G1: 0 blocks evicted from every pool" || fail "evict --all"
"$KVCTL_BIN" evict --tier g2 | grep -q "^G2: 0 blocks evicted from every pool" || fail "evict --tier g2"
"$KVCTL_BIN" -o json flush | python3 -c 'import json,sys; assert json.load(sys.stdin)["clean"] is True' || fail "flush"
[[ $(ask "release") == "ok 3" ]] || fail "worker release after evict"

# reload without a file: nothing changes.
"$KVCTL_BIN" reload | grep -q "none" || fail "kvctl reload"
"$KVCTL_BIN" -o json reload | python3 -c 'import json,sys; j=json.load(sys.stdin); assert j["applied"] == [] and j["not_applied"] == []' || fail "kvctl -o json reload"

# Errors: one line on stderr and a non-zero exit code.
one_line() {  # expected-status command...
	local want=$1 err rc
	shift
	set +e
	err=$("$@" 2>&1 >/dev/null); rc=$?
	set -e
	[ "$rc" -eq "$want" ] || fail "$*: exit $rc, expected $want ($err)"
	[ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] || fail "$*: error is not one line: $err"
}
one_line 1 "$KVCTL_BIN" -s "$dir/nope.sock" status
one_line 1 "$KVCTL_BIN" evict --pool 4000
one_line 2 "$KVCTL_BIN" frobnicate
one_line 2 "$KVCTL_BIN" evict
one_line 2 "$KVCTL_BIN" evict --pool 1 --all
one_line 2 "$KVCTL_BIN" evict --tier g4
one_line 2 "$KVCTL_BIN" status --pool 1
one_line 2 "$KVCTL_BIN" top -n 0
one_line 2 "$KVCTL_BIN" drain --timeout soon
one_line 2 "$KVCTL_BIN" -o yaml status
one_line 2 "$KVCTL_BIN" status extra

# Admin operations on the worker socket: allowed to root and the daemon's uid.
"$KVCTL_BIN" -s "$KVCACHED_SOCKET" clients >/dev/null || fail "clients on the worker socket"

# drain: the worker still connected keeps the daemon until it quits.
"$KVCTL_BIN" drain --timeout 20s | grep -q "^draining: 1 client left" || fail "kvctl drain"
"$KVCTL_BIN" status | grep -q "^state  *draining" || fail "status while draining"
[[ $(ask "alloc 1") == "err -1012 "* ]] || fail "alloc while draining"
echo quit >&"${W[1]}"
wait "$w_pid" || true
wait $pid || fail "daemon exit status $?"
echo "kvctl ok"
