#!/usr/bin/env python3
"""Drain on SIGTERM: a client holding blocks can still release them, new
allocations are refused with ESHUTDOWN and a message that says why, the worker
socket stops accepting while the admin socket keeps serving, and the daemon
exits 0 once the client has gone, or at drain_timeout when it never goes. A
second SIGTERM exits at once; kvctl drain --wait starts a drain and returns
when the daemon has exited."""
import json
import os
import signal
import time

import kvt
from kvt import check

kvt.need_bins()
SHUTDOWN = "-1012"   # KVC_ESHUTDOWN


def holding_worker(d):
    w = kvt.Worker(d.sock)
    check(w.ok(), "worker connect: " + w.hello, d.log)
    check(w.cmd("pool p 65536").startswith("ok"), "register", d.log)
    check(w.cmd("alloc 8") == "ok 8", "alloc 8", d.log)
    return w


# 1. A client leaves during the drain: exit 0 soon after, well before the timeout.
d = kvt.Daemon(kvt.tmpdir(), "--pool-size=16MiB", "--segment-size=4MiB", "--drain-timeout=60s")
w = holding_worker(d)
w2 = holding_worker(d)
d.signal(signal.SIGTERM)
check(d.wait_log("draining"), "no drain log line", d.log)
r = w.cmd("alloc 1")
check(r.startswith("err " + SHUTDOWN), "alloc while draining: " + r, d.log)
check("shutting down" in r and "release" in r, "ESHUTDOWN message says why: " + r, d.log)
r = w.cmd("ping")
check(r.startswith("ok"), "stats while draining: " + r, d.log)
check(not kvt.can_connect(d.sock), "worker socket still accepts while draining", d.log)
st = d.kvctl("-o", "json", "status")
check(st.returncode == 0, "kvctl status on the admin socket while draining: " + st.stderr, d.log)
js = json.loads(st.stdout)
check(js["state"] == "draining" and js["clients"] == 2, "status: %s" % js, d.log)
check(w.cmd("seal") == "ok 8", "seal while draining", d.log)
check(w.cmd("release") == "ok 8", "release while draining", d.log)
w.quit()
check(d.proc.poll() is None, "exited while a client still holds blocks", d.log)
t0 = time.monotonic()
check(w2.cmd("release") == "ok 8", "second client releases", d.log)
w2.quit()
rc = d.wait(20)
check(rc == 0, "exit status after the last client left: %s" % rc, d.log)
check(time.monotonic() - t0 < 10, "exit took too long", d.log)
check("drained: no client left" in d.logtext(), "no 'drained' log line", d.log)
check(not os.path.exists(d.sock) and not os.path.exists(d.admin), "socket files left", d.log)
print("ok: drain, client leaves")

# 2. A client that never leaves: exit 0 at the drain timeout.
d = kvt.Daemon(kvt.tmpdir(), "--pool-size=16MiB", "--segment-size=4MiB", "--drain-timeout=1s")
w = holding_worker(d)
t0 = time.monotonic()
d.signal(signal.SIGTERM)
rc = d.wait(20)
el = time.monotonic() - t0
check(rc == 0, "exit status at the drain timeout: %s" % rc, d.log)
check(0.8 <= el < 10, "drain timeout of 1 s took %.1f s" % el, d.log)
check("drain timeout" in d.logtext(), "no drain timeout log line", d.log)
w.kill()
print("ok: drain timeout (%.2f s)" % el)

# 3. A second SIGTERM exits at once, with a client still holding blocks.
d = kvt.Daemon(kvt.tmpdir(), "--pool-size=16MiB", "--segment-size=4MiB", "--drain-timeout=60s")
w = holding_worker(d)
d.signal(signal.SIGTERM)
check(d.wait_log("draining"), "no drain log line", d.log)
t0 = time.monotonic()
d.signal(signal.SIGTERM)
rc = d.wait(20)
check(rc == 0, "exit status after a second SIGTERM: %s" % rc, d.log)
check(time.monotonic() - t0 < 5, "second SIGTERM did not exit at once", d.log)
w.kill()
print("ok: second SIGTERM")

# 4. kvctl drain --wait, with the configured timeout and then a given one.
d = kvt.Daemon(kvt.tmpdir(), "--pool-size=16MiB", "--segment-size=4MiB", "--drain-timeout=60s")
w = holding_worker(d)
r = d.kvctl("-o", "json", "drain", "--timeout", "500ms")
check(r.returncode == 0, "kvctl drain: " + r.stderr, d.log)
js = json.loads(r.stdout)
check(js["clients"] == 1 and not js["already"], "drain reply: %s" % js, d.log)
r = d.kvctl("drain", "--wait")
check(r.returncode == 0 and "draining already" in r.stdout and "exited" in r.stdout,
      "kvctl drain --wait: %r %r" % (r.stdout, r.stderr), d.log)
rc = d.wait(10)
check(rc == 0, "exit status after kvctl drain: %s" % rc, d.log)
w.kill()
print("ok: kvctl drain --wait")

# 5. drain_timeout = 0: SIGTERM exits at once, as before the drain existed.
d = kvt.Daemon(kvt.tmpdir(), "--pool-size=16MiB", "--segment-size=4MiB", "--drain-timeout=0")
w = holding_worker(d)
d.signal(signal.SIGTERM)
check(d.wait(10) == 0, "drain_timeout 0: exit status", d.log)
w.kill()
print("ok: drain_timeout 0")
kvt.cleanup()
