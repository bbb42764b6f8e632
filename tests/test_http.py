#!/usr/bin/env python3
"""GET /metrics over HTTP (issue 11): a real daemon with metrics_listen on a
free loopback port, real kvt_worker processes, real HTTP clients (curl and
urllib). The scrape passes `promtool check metrics` (no error, no lint
warning); the request and demotion histograms grow with the workload; an
ENOSPC the test provokes is counted, daemon-wide and for its namespace;
404 and 405 for other paths and methods; HEAD works. A hostile client (a
request left half-sent, more connections than the limit, an oversized
header) does not keep worker requests from being served, and the endpoint
answers again once it goes. Then socket activation: systemd-socket-activate
passes a TCP socket named "metrics" (and the worker socket), and the daemon
serves on it without binding anything itself.

Needs curl and promtool (skips with 77 without them)."""
import os
import re
import shutil
import signal
import socket
import subprocess
import urllib.error
import urllib.request

import kvt
from kvt import check

kvt.need_bins()
CURL, PROMTOOL = shutil.which("curl"), shutil.which("promtool")
if not CURL or not PROMTOOL:
    kvt.skip("needs curl and promtool")
if "+http" not in subprocess.run([kvt.BIN, "--version"], capture_output=True, text=True).stdout:
    kvt.skip("built without libmicrohttpd")


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def curl(url, *args):
    """(status, headers, body) of one request with curl."""
    r = subprocess.run([CURL, "-sS", "--max-time", "20", "-D", "-", "-o", "-", *args, url],
                       capture_output=True, timeout=30)
    if r.returncode != 0:
        return None, "", r.stderr.decode(errors="replace")
    raw = r.stdout.decode(errors="replace")
    head, _, body = raw.partition("\r\n\r\n")
    status = int(head.split(" ", 2)[1])
    return status, head, body


def scrape(url):
    """The exposition through urllib, or None while it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            check(r.status == 200, "status %d" % r.status)
            check(r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8",
                  "Content-Type: %s" % r.headers["Content-Type"])
            return r.read().decode()
    except (urllib.error.URLError, ConnectionError, OSError):
        return None


def value(text, name, labels=""):
    """The sample name{labels} (labels exactly as written), or None."""
    want = name + ("{%s}" % labels if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def promtool(text, log):
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(),
          "promtool check metrics: rc %d: %s%s" % (r.returncode, r.stdout, r.stderr), log)


d = kvt.tmpdir()
port = free_port()
url = "http://127.0.0.1:%d/metrics" % port
dm = kvt.Daemon(d, "--pool-size=16MiB", "--segment-size=4MiB", "--host-tier-size=16MiB",
                "--metrics-listen=127.0.0.1:%d" % port)
check(kvt.wait_for(lambda: scrape(url) is not None), "no answer on " + url, dm.log)
check("metrics over HTTP on 127.0.0.1:%d" % port in dm.logtext(), "log line", dm.log)
before = scrape(url)
promtool(before, dm.log)
print("ok: scrape of an idle daemon passes promtool")

# A workload: a pool nearly filled with cached blocks (G1 under its demote
# watermark: demotions to G2), then an allocation that cannot be met.
w = kvt.Worker(dm.sock)
check(w.ok(), "worker: " + w.hello, dm.log)
ns = "uid-%d" % os.getuid()
check(w.cmd("pool p 65536").startswith("ok"), "pool", dm.log)
check(w.cmd("alloc 240") == "ok 240", "alloc", dm.log)
check(w.cmd("seal") == "ok 240", "seal", dm.log)
check(w.cmd("release") == "ok 240", "release", dm.log)
check(w.cmd("alloc 200") == "ok 200", "alloc again", dm.log)
r = w.cmd("alloc 100000")
check(r.startswith("err") and "cannot get" in r, "an allocation past the pool: " + r, dm.log)


def grown():
    t = scrape(url)
    return t and (value(t, "kvcached_demotion_duration_seconds_count") or 0) > 0 and \
        (value(t, "kvcached_enospc_total") or 0) >= 1 and \
        (value(t, "kvcached_request_duration_seconds_count", 'op="alloc"') or 0) >= 3


check(kvt.wait_for(grown), "histograms and counters did not grow: " + (scrape(url) or ""),
      dm.log)
after = scrape(url)
promtool(after, dm.log)
check(value(after, "kvcached_namespace_enospc_total", 'namespace="%s"' % ns) >= 1,
      "ENOSPC of namespace %s not counted" % ns, dm.log)
check(value(after, "kvcached_request_duration_seconds_count", 'op="seal"') >= 1, "seal", dm.log)
# Buckets are cumulative and end at _count.
b = [float(m.group(1)) for m in re.finditer(
    r'^kvcached_request_duration_seconds_bucket\{op="alloc",le="[^"]+"\} (\S+)$', after, re.M)]
check(len(b) == 23 and b == sorted(b) and
      b[-1] == value(after, "kvcached_request_duration_seconds_count", 'op="alloc"'),
      "alloc buckets: %s" % b, dm.log)
check(value(after, "kvcached_demotion_duration_seconds_sum") > 0, "demotion _sum", dm.log)
# What the builds cost the loop: counted beside the builds themselves.
check(value(after, "kvcached_http_expositions_built_total") >= 1 and
      value(after, "kvcached_http_build_cpu_seconds_total") is not None and
      value(after, "kvcached_http_build_cpu_seconds_total") >= 0, "build CPU time", dm.log)
for fam in ("kvcached_promotion_duration_seconds_count", "kvcached_writeback_duration_seconds_count",
            "kvcached_parked_requests", "kvcached_output_queued_bytes",
            "kvcached_segment_fds_in_flight", "kvcached_paused_connections"):
    check(re.search("^%s[ {]" % fam, after, re.M), fam + " missing", dm.log)
# The same exposition as kvctl metrics prints (one generator): same families.
r = dm.kvctl("metrics")
check(r.returncode == 0, "kvctl metrics: " + r.stderr, dm.log)
fams = lambda t: re.findall(r"^# TYPE (\S+)", t, re.M)
check(fams(r.stdout) == fams(after), "families differ from kvctl metrics", dm.log)
print("ok: histograms, ENOSPC (daemon-wide and namespace %s), promtool clean" % ns)

# Real HTTP clients, methods and paths.
st, head, body = curl(url)
check(st == 200 and "content-type: text/plain; version=0.0.4; charset=utf-8" in head.lower() and
      "kvcached_info" in body, "curl GET: %s %s" % (st, head), dm.log)
st, head, body = curl(url, "-I")
check(st == 200 and "kvcached_info" not in body, "HEAD: %s %r" % (st, body), dm.log)
for path in ("/", "/metricsx", "/metrics/", "/../metrics", "/%00"):
    st, _, _ = curl("http://127.0.0.1:%d%s" % (port, path), "--path-as-is")
    check(st == 404, "GET %s: %s" % (path, st), dm.log)
for method in ("POST", "PUT", "DELETE", "OPTIONS"):
    st, head, _ = curl(url, "-X", method, "--data-binary", "x" * 100)
    check(st == 405 and "allow: get, head" in head.lower(), "%s: %s %s" % (method, st, head),
          dm.log)
print("ok: curl: 200, HEAD, 404 for other paths, 405 (Allow: GET, HEAD) for other methods")

# Hostile clients: one request half-sent, then as many idle connections as
# the limit and more, then a header far past the per-connection memory.
# The first worker lets its blocks go first: pool q needs whole pages, and
# with 200 of p's blocks held, the demotions left p's free and cached blocks
# spread over all of p's runs as often as not (a pool's runs are its own).
check(w.cmd("release") == "ok 200", "release", dm.log)
half = socket.create_connection(("127.0.0.1", port))
half.sendall(b"GET /metr")
idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
big = socket.create_connection(("127.0.0.1", port))
try:
    big.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (256 * 1024))
except OSError:
    pass   # the daemon may close it before all is sent
w2 = kvt.Worker(dm.sock)
check(w2.ok(), "worker while HTTP is flooded: " + w2.hello, dm.log)
check(w2.cmd("pool q 65536").startswith("ok"), "pool while flooded", dm.log)
for _ in range(20):
    r = w2.cmd("alloc 4")
    check(r == "ok 4", "alloc while flooded: " + r, dm.log)
    r = w2.cmd("release")
    check(r == "ok 4", "release while flooded: " + r, dm.log)
check(dm.proc.poll() is None, "daemon died", dm.log)
for s in [half, big] + idle:
    s.close()
check(kvt.wait_for(lambda: scrape(url) is not None, timeout=30), "no answer after the flood",
      dm.log)
print("ok: a half-sent request, 42 connections and a 256 KiB header stall no worker")

w2.quit()
w.quit()
dm.signal(signal.SIGTERM)
check(dm.wait(10) == 0, "exit status", dm.log)

# Socket activation: the worker socket and a TCP socket named metrics.
ACT = shutil.which("systemd-socket-activate")
if not ACT or "+systemd" not in subprocess.run([kvt.BIN, "--version"], capture_output=True,
                                                text=True).stdout:
    print("socket activation not tested: no systemd-socket-activate or no libsystemd")
    kvt.cleanup()
    raise SystemExit(0)
d = kvt.tmpdir()
port = free_port()
url = "http://127.0.0.1:%d/metrics" % port
wsock = os.path.join(d, "act.sock")
own, own_admin = os.path.join(d, "own.sock"), os.path.join(d, "own-admin.sock")
cmd = [ACT, "-l", wsock, "-l", "127.0.0.1:%d" % port, "--fdname=worker:metrics", kvt.BIN,
       "--config=", "--socket=" + own, "--admin-socket=" + own_admin]
dm = kvt.Daemon(d, "--pool-size=16MiB", "--segment-size=4MiB", argv0=cmd, wait=False)
check(kvt.wait_for(lambda: os.path.exists(wsock)), "systemd-socket-activate did not listen",
      dm.log)
# The first scrape starts the daemon; it waits in the socket's queue.
st, head, body = curl(url)
check(st == 200 and "kvcached_info" in body, "scrape through the passed socket: %s" % st, dm.log)
check("metrics over HTTP on 127.0.0.1:%d (from systemd)" % port in dm.logtext(), "log line",
      dm.log)
w = kvt.Worker(wsock)
check(w.ok() and w.cmd("pool p 65536").startswith("ok") and w.cmd("alloc 2") == "ok 2",
      "worker through the passed worker socket", dm.log)
check(kvt.wait_for(lambda: (value(scrape(url) or "", "kvcached_request_duration_seconds_count",
                                  'op="alloc"') or 0) >= 1), "alloc not counted", dm.log)
promtool(scrape(url), dm.log)
w.quit()
dm.signal(signal.SIGTERM)
check(dm.wait(10) == 0, "exit status", dm.log)
print("ok: socket activation: metrics on a passed TCP socket")
kvt.cleanup()
