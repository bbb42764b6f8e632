#!/usr/bin/env python3
"""GET /metrics under attack (issue 29, items 1 and 2 of its attack list): a
real daemon with 300 pools and metrics_listen, real HTTP clients.

- 16 clients scraping in a loop (two per peer address, 127.0.0.10-17) get
  whole expositions, every one, while a
  worker's requests go on being answered; with metrics_min_interval 60s
  every one of those scrapes shares one or two builds (counted by
  kvcached_http_expositions_built_total), never one per scrape.
- 64 slow connections from another peer address (127.0.0.2), one byte of a
  request now and then: the daemon keeps at most
  metrics_max_connections_per_address of them, closes each one
  metrics_header_timeout after accept whatever it sends, and a scraper on
  127.0.0.1 is answered every time meanwhile (counts, not times).
- 80 connections opened and closed at once: /metrics answers after them.
- /metrics%00.txt and other spellings are 404, not /metrics; a NUL in the
  request line (method or path) is 400.
- kvcached_loop_lag_seconds counts the loop's turns.
Needs curl (77 without)."""
import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import kvt
from kvt import check

kvt.need_bins()
CURL = shutil.which("curl")
if not CURL:
    kvt.skip("needs curl")
if "+http" not in subprocess.run([kvt.BIN, "--version"], capture_output=True, text=True).stdout:
    kvt.skip("built without libmicrohttpd")
try:
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    s.close()
except OSError:
    kvt.skip("cannot bind 127.0.0.2 (another loopback peer address)")

POOLS = 300
PER_ADDR = 8


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def get(port, path="/metrics", timeout=20, source="127.0.0.1"):
    """(status, body bytes) of one GET with curl from address source, or
    (None, b"")."""
    r = subprocess.run([CURL, "-sS", "--max-time", str(timeout), "--interface", source, "-o",
                        "-", "-w", "\n%{http_code}", "http://127.0.0.1:%d%s" % (port, path)],
                       capture_output=True, timeout=timeout + 10)
    if r.returncode != 0:
        return None, b""
    body, _, code = r.stdout.rpartition(b"\n")
    return int(code), body


def raw(port, request, timeout=10):
    """The status line of a request sent as given (curl would normalise it)."""
    c = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    c.sendall(request)
    data = b""
    while b"\r\n" not in data:
        b = c.recv(4096)
        if not b:
            break
        data += b
    c.close()
    return data.split(b"\r\n", 1)[0].decode(errors="replace")


def value(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


d = kvt.tmpdir()
port = free_port()
daemon = kvt.Daemon(d, "--metrics-listen=127.0.0.1:%d" % port, "--pool-size=64MiB",
                    "--segment-size=16MiB", "--max-pools-per-namespace=%d" % (POOLS + 8),
                    "--metrics-min-interval=60s", "--metrics-header-timeout=1s",
                    "--metrics-max-connections=32",
                    "--metrics-max-connections-per-address=%d" % PER_ADDR)
w = kvt.Worker(daemon.sock)
check(w.ok(), "worker: %s" % w.hello, daemon.log)
for i in range(POOLS):
    check(w.cmd("pool p%d 4096" % i).startswith("ok"), "pool %d" % i, daemon.log)

# --- 16 scrapers in a loop, a worker beside them ---------------------------
status, first = get(port)
check(status == 200 and b"kvcached_pool_blocks" in first, "first scrape: %s" % status, daemon.log)
size = len(first)
check(size > 100000, "exposition of %d pools is %d bytes" % (POOLS, size))
results = []
lock = threading.Lock()


# Two scrapers per peer address, on eight addresses: a scraper's connection
# that the daemon has not yet seen closed stands beside its next one, so an
# address holds at most four of them, under metrics_max_connections_per_address
# (that bound is what the slow connections below test), and all of them at
# most 32, metrics_max_connections, however the machine's load lines them up.
SOURCES = ["127.0.0.%d" % (10 + i) for i in range(8)]


def scraper(source):
    for _ in range(8):
        st, body = get(port, source=source)
        with lock:
            results.append((st, len(body), body.endswith(b"\n") and b"# TYPE kvcached_loop_lag_seconds" in body))


ts = [threading.Thread(target=scraper, args=(SOURCES[i % 8],)) for i in range(16)]
for t in ts:
    t.start()
pings = 0
while any(t.is_alive() for t in ts):
    check(w.cmd("ping").startswith("ok"), "worker ping during the scrapes", daemon.log)
    pings += 1
for t in ts:
    t.join()
check(len(results) == 128, "%d scrapes" % len(results))
bad = [r for r in results if r[0] != 200 or not r[2] or abs(r[1] - size) > size // 10]
check(not bad, "scrapes not answered whole: %s" % bad[:5], daemon.log)
check(pings > 0, "the worker was answered during the scrapes")
def fresh():
    """The exposition now, through kvctl (HTTP serves one up to 60 s old here)."""
    r = daemon.kvctl("metrics")
    check(r.returncode == 0, "kvctl metrics: %s" % r.stderr)
    return r.stdout


text = fresh()
built = value(text, "kvcached_http_expositions_built_total")
check(built is not None and built <= 2,
      "129 scrapes within metrics_min_interval: %s expositions built" % built, daemon.log)
check(value(text, "kvcached_http_scrapes_total") >= 129, "scrapes counted")
check((value(text, "kvcached_loop_lag_seconds_count") or 0) > 0, "loop turns counted")
print("ok: 128 scrapes by 16 clients, %d bytes each, %d builds; %d worker pings beside them"
      % (size, built, pings))

# --- the path as sent -------------------------------------------------------
for path in (b"/metrics%00.txt", b"/metrics%00", b"/%6detrics", b"/metrics/", b"/metricsx"):
    line = raw(port, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    check(" 404 " in line + " ", "GET %s: %s" % (path.decode(), line), daemon.log)
check(" 200 " in raw(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n") + " ", "/metrics 200")
# A NUL in the line itself: libmicrohttpd hands over C strings, so these
# arrived as GET /metrics (the fuzz harness found the first).
for line_ in (b"GET\0\0\0D /metrics", b"GET /metrics\0x", b"GET /metrics\0?a=b", b"GET /metrics?"):
    line = raw(port, line_ + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    check(" 400 " in line + " ", "%r: %s" % (line_, line), daemon.log)
for q in (b"/metrics?a=b", b"/metrics?a=b&c=d"):
    line = raw(port, b"GET " + q + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    check(" 200 " in line + " ", "GET %s: %s" % (q.decode(), line), daemon.log)
print("ok: /metrics%00.txt and other spellings are 404, a NUL in the request line 400")

# --- 64 slow connections from 127.0.0.2 -------------------------------------
REQ = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 400 + b"\r\n\r\n"
slow = []
for _ in range(64):
    c = socket.socket()
    c.bind(("127.0.0.2", 0))
    c.settimeout(0)
    c.connect_ex(("127.0.0.1", port))
    slow.append(c)


def alive(c):
    """Whether c is still open on the daemon's side (no EOF, no reset)."""
    try:
        return c.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


# Those the daemon has not accepted yet wait in the kernel's backlog; once
# it has, no more than the per-address bound stay open.
check(kvt.wait_for(lambda: sum(alive(c) for c in slow) <= PER_ADDR, 10),
      "%d slow connections of one address held (bound %d)"
      % (sum(alive(c) for c in slow), PER_ADDR), daemon.log)
ok = 0
most_alive = 0
deadline = time.monotonic() + 3.0   # three header timeouts: a byte each 0.2 s
sent = 0
while time.monotonic() < deadline:
    for c in slow:
        try:
            c.send(REQ[sent:sent + 1])
        except OSError:
            pass
    sent += 1
    n = sum(alive(c) for c in slow)
    most_alive = max(most_alive, n)
    st, body = get(port, timeout=10)
    check(st == 200 and len(body) > size // 2, "scrape beside slow connections: %s" % st,
          daemon.log)
    ok += 1
    time.sleep(0.2)
check(sent < len(REQ), "the slow requests were never whole")
check(most_alive <= PER_ADDR, "%d slow connections of one address held (bound %d)"
      % (most_alive, PER_ADDR), daemon.log)
check(kvt.wait_for(lambda: not any(alive(c) for c in slow), 15),
      "slow connections still open past metrics_header_timeout", daemon.log)
for c in slow:
    c.close()
text = fresh()
closed = (value(text, "kvcached_http_evicted_total") + value(text, "kvcached_http_refused_total") +
          value(text, "kvcached_http_header_timeouts_total"))
check(closed >= 64, "slow connections closed and counted: %s" % closed, daemon.log)
check(value(text, "kvcached_http_header_timeouts_total") >= 1, "header timeouts counted")
print("ok: 64 slow connections: at most %d held, all closed (%d counted); %d scrapes beside "
      "them answered" % (most_alive, closed, ok))

# --- 80 connections opened and closed ---------------------------------------
# The daemon is stopped meanwhile, so that the 80 and a scrape after them wait
# in the backlog together and are accepted in one burst, before any of the 80
# is read: those whose peers left must not hold places against the scrape.
daemon.proc.send_signal(signal.SIGSTOP)
try:
    for _ in range(80):
        c = socket.create_connection(("127.0.0.1", port))
        c.close()
    scrape = socket.create_connection(("127.0.0.1", port), timeout=20)
    scrape.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
finally:
    daemon.proc.send_signal(signal.SIGCONT)
reply = b""
try:
    while True:
        b = scrape.recv(65536)
        if not b:
            break
        reply += b
except OSError as e:
    reply += b"\n(%s)" % str(e).encode()
scrape.close()
check(reply.startswith(b"HTTP/1.1 200") and len(reply) > size // 2,
      "a scrape accepted with 80 closed connections: %r" % reply[:80], daemon.log)
st, body = get(port)
check(st == 200 and len(body) > size // 2, "after 80 connections: %s" % st, daemon.log)
check(w.cmd("ping").startswith("ok"), "worker after all that", daemon.log)
print("ok: /metrics answers after 80 connections opened and closed")
w.quit()
daemon.kill()
