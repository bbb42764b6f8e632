#!/usr/bin/env python3
"""sd_notify: NOTIFY_SOCKET points at a datagram socket this test owns.
READY=1 arrives once the worker and admin sockets take connections, STATUS=
lines keep coming, WATCHDOG=1 keeps arriving at about half of WATCHDOG_USEC
(loose bounds: a count in a window), RELOADING=1 with MONOTONIC_USEC and then
READY=1 on SIGHUP, and STOPPING=1 on SIGTERM. WATCHDOG_PID naming another
process means no watchdog."""
import os
import select
import signal
import socket
import subprocess
import time

import kvt
from kvt import check

kvt.need_bins()
if "-systemd" in subprocess.run([kvt.BIN, "--version"], capture_output=True, text=True).stdout:
    kvt.skip("built without libsystemd")


class Listener:
    def __init__(self, d):
        self.path = os.path.join(d, "notify.sock")
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.s.bind(self.path)
        self.msgs = []   # (monotonic time, {key: value})

    def recv(self, timeout):
        """Receives what arrives within timeout; returns the new messages."""
        new = []
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                break
            r, _, _ = select.select([self.s], [], [], left)
            if not r:
                break
            data = self.s.recv(65536).decode()
            kv = dict(line.split("=", 1) for line in data.split("\n") if "=" in line)
            new.append((time.monotonic(), kv))
        self.msgs += new
        return new

    def wait_for(self, key, value=None, timeout=10.0):
        """The first message (new or kept) with key (= value)."""
        end = time.monotonic() + timeout
        seen = 0
        while True:
            for m in self.msgs[seen:]:
                if key in m[1] and (value is None or m[1][key] == value):
                    return m
            seen = len(self.msgs)
            left = end - time.monotonic()
            if left <= 0:
                return None
            self.recv(min(left, 0.2))


d = kvt.tmpdir()
n = Listener(d)
WD_USEC = 200000   # pings expected every 100 ms

# The daemon reads WATCHDOG_PID; sh exports its own pid, which exec makes the
# daemon's.
cmd = ["/bin/sh", "-c", 'WATCHDOG_PID=$$ exec "$0" "$@"', kvt.BIN, "--config=",
       "--socket=" + os.path.join(d, "w.sock")]
dm = kvt.Daemon(d, "--pool-size=16MiB", "--segment-size=4MiB", "--status-interval=200ms",
                "--drain-timeout=5s", argv0=cmd, wait=False,
                env={"NOTIFY_SOCKET": n.path, "WATCHDOG_USEC": str(WD_USEC)})
m = n.wait_for("READY", "1")
check(m is not None, "no READY=1", dm.log)
# At this moment both sockets take connections.
check(kvt.can_connect(dm.sock) and kvt.can_connect(dm.admin),
      "READY=1 came before the sockets listen", dm.log)
check("STATUS" in m[1] and "pages" in m[1]["STATUS"], "READY=1 without a STATUS=: %s" % m[1],
      dm.log)
print("ok: READY=1 with", m[1]["STATUS"])

# The watchdog: about 10 pings a second; take 2 s and ask for at least 8 and
# at most 40 (timing on a loaded machine is loose).
t0 = time.monotonic()
n.recv(2.0)
pings = [t for t, kv in n.msgs if kv.get("WATCHDOG") == "1" and t >= t0]
check(8 <= len(pings) <= 40, "%d WATCHDOG=1 in 2 s, expected about 20" % len(pings), dm.log)
statuses = [kv["STATUS"] for t, kv in n.msgs if "STATUS" in kv and t >= t0]
check(len(statuses) >= 3, "%d STATUS= in 2 s with status_interval 200ms" % len(statuses), dm.log)
print("ok: %d WATCHDOG=1 and %d STATUS= in 2 s" % (len(pings), len(statuses)))

# Reload: RELOADING=1 with MONOTONIC_USEC, then READY=1.
mark = len(n.msgs)
dm.signal(signal.SIGHUP)
m = n.wait_for("RELOADING", "1")
check(m is not None and "MONOTONIC_USEC" in m[1] and int(m[1]["MONOTONIC_USEC"]) > 0,
      "RELOADING=1 with MONOTONIC_USEC: %s" % (m and m[1]), dm.log)
ready = [kv for t, kv in n.msgs[mark:] if kv.get("READY") == "1"]
if not ready:
    check(n.wait_for("READY", "1", 5) is not None, "no READY=1 after the reload", dm.log)
print("ok: RELOADING=1, READY=1")

# Drain: STOPPING=1, and a STATUS= that says so.
w = kvt.Worker(dm.sock)
check(w.ok() and w.cmd("pool p 65536").startswith("ok") and w.cmd("alloc 2") == "ok 2",
      "worker", dm.log)
mark = len(n.msgs)
dm.signal(signal.SIGTERM)
m = n.wait_for("STOPPING", "1")
check(m is not None, "no STOPPING=1 on SIGTERM", dm.log)
check("draining" in m[1].get("STATUS", ""), "STOPPING=1 status: %s" % m[1], dm.log)
w.quit()
check(dm.wait(10) == 0, "exit status", dm.log)
print("ok: STOPPING=1 with", m[1]["STATUS"])

# WATCHDOG_PID of another process: no pings.
d2 = kvt.tmpdir()
n2 = Listener(d2)
dm = kvt.Daemon(d2, "--pool-size=16MiB", "--segment-size=4MiB", wait=False,
                env={"NOTIFY_SOCKET": n2.path, "WATCHDOG_USEC": str(WD_USEC),
                     "WATCHDOG_PID": "1"})
check(n2.wait_for("READY", "1") is not None, "no READY=1", dm.log)
# A window, not a wait: that no ping comes can only be watched for a while;
# 0.6 s is 6 periods of the pings that a watchdog would send.
n2.recv(0.6)
check(not [kv for t, kv in n2.msgs if "WATCHDOG" in kv], "pings for another pid's watchdog",
      dm.log)
dm.signal(signal.SIGTERM)
check(dm.wait(10) == 0, "exit status", dm.log)
print("ok: no watchdog for WATCHDOG_PID=1")
kvt.cleanup()
