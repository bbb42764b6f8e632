#!/usr/bin/env python3
"""Socket activation: systemd-socket-activate passes a worker and an admin
socket (--fdname=worker:admin); it starts the daemon on the first connection. Workers connect and work through the worker
socket, kvctl through the admin one; the daemon binds neither of its
configured paths (no file appears there, and it says so in its log); a drain
leaves the passed sockets alone. A single socket with a name that is not
admin's is the worker socket, and the daemon binds its own admin socket."""
import json
import os
import shutil
import signal
import subprocess

import kvt
from kvt import check

kvt.need_bins()
ACT = shutil.which("systemd-socket-activate")
if not ACT:
    kvt.skip("no systemd-socket-activate")
if "-systemd" in subprocess.run([kvt.BIN, "--version"], capture_output=True, text=True).stdout:
    kvt.skip("built without libsystemd")

d = kvt.tmpdir()
wsock, asock = os.path.join(d, "act.sock"), os.path.join(d, "act-admin.sock")
own = os.path.join(d, "own.sock")        # what the daemon would bind itself
own_admin = os.path.join(d, "own-admin.sock")
cmd = [ACT, "-l", wsock, "-l", asock, "--fdname=worker:admin", kvt.BIN, "--config=",
       "--socket=" + own, "--admin-socket=" + own_admin]
dm = kvt.Daemon(d, "--pool-size=16MiB", "--segment-size=4MiB", "--drain-timeout=5s",
                argv0=cmd, wait=False)
check(kvt.wait_for(lambda: os.path.exists(wsock) and os.path.exists(asock)),
      "systemd-socket-activate did not listen", dm.log)
# The first connection starts the daemon; its Hello is answered once it runs.
w = kvt.Worker(wsock)
check(w.ok(), "worker through the activated socket: " + w.hello, dm.log)
check(dm.proc.poll() is None, "daemon exited: %s" % dm.proc.returncode, dm.log)
check("socket activation: worker and admin sockets from systemd" in dm.logtext(),
      "no socket activation log line", dm.log)
check(not os.path.exists(own) and not os.path.exists(own_admin),
      "the daemon bound its own sockets too", dm.log)
check(w.cmd("pool p 65536").startswith("ok") and w.cmd("alloc 4") == "ok 4", "alloc", dm.log)
r = kvt.kvctl("-s", asock, "-o", "json", "clients")
check(r.returncode == 0, "kvctl through the activated admin socket: " + r.stderr, dm.log)
cl = json.loads(r.stdout)["clients"]
check(any(c["socket"] == "admin" and c["name"] == "kvctl" for c in cl) and
      any(c["socket"] == "worker" and c["refs"] == 4 for c in cl), "clients: %s" % cl, dm.log)
check(w.cmd("release") == "ok 4", "release", dm.log)
w.quit()
dm.signal(signal.SIGTERM)
check(dm.wait(10) == 0, "exit status", dm.log)
check(os.path.exists(wsock) and os.path.exists(asock), "the daemon removed a passed socket",
      dm.log)
print("ok: worker and admin sockets from socket activation")

# One socket, named otherwise: the worker socket; the admin socket is bound.
d = kvt.tmpdir()
wsock = os.path.join(d, "only.sock")
own, own_admin = os.path.join(d, "own.sock"), os.path.join(d, "own-admin.sock")
cmd = [ACT, "-l", wsock, "--fdname=kvcached.socket", kvt.BIN, "--config=", "--socket=" + own,
       "--admin-socket=" + own_admin]
dm = kvt.Daemon(d, "--pool-size=16MiB", "--segment-size=4MiB", argv0=cmd, wait=False)
check(kvt.wait_for(lambda: os.path.exists(wsock)), "systemd-socket-activate did not listen",
      dm.log)
w = kvt.Worker(wsock)
check(w.ok() and w.cmd("pool p 65536").startswith("ok"), "worker: " + w.hello, dm.log)
check(kvt.wait_for(lambda: kvt.can_connect(own_admin) or dm.proc.poll() is not None),
      "admin socket not bound", dm.log)
check("socket activation: worker socket from systemd" in dm.logtext(), "log line", dm.log)
check(not os.path.exists(own), "bound the worker socket although it was passed", dm.log)
w.quit()
r = kvt.kvctl("-s", own_admin, "status")
check(r.returncode == 0, "kvctl on the bound admin socket: " + r.stderr, dm.log)
dm.signal(signal.SIGTERM)
check(dm.wait(10) == 0, "exit status", dm.log)
check(not os.path.exists(own_admin), "the bound admin socket was not removed", dm.log)
print("ok: one activated socket, the other bound")
kvt.cleanup()
