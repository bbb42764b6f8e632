#!/usr/bin/env python3
"""Binding the sockets (test_bind_race): two daemons started at the same
moment on one socket path used to be able to both find it free, the second's
unlink leaving the first listening on a socket nobody could reach. Now
"<path>.lock" serialises them: exactly one serves, the other exits saying
another daemon has the path. The socket appears at its path only with its
mode (it is bound in a private directory and renamed into place: no temporary
is left behind), and a daemon killed with SIGKILL leaves nothing that stops
the next one."""
import os
import signal
import stat

import kvt
from kvt import check

kvt.need_bins()
ARGS = ["--pool-size=8MiB", "--segment-size=2MiB"]

for rnd in range(20):
    d = kvt.tmpdir()
    a = kvt.Daemon(d, *ARGS, wait=False, log="a.log")
    b = kvt.Daemon(d, *ARGS, wait=False, log="b.log")
    # One of the two exits; wait for that, then for the other to serve.
    check(kvt.wait_for(lambda: a.proc.poll() is not None or b.proc.poll() is not None, 30),
          "round %d: both daemons still run: one must have lost the race" % rnd, a.log)
    loser, winner = (a, b) if a.proc.poll() is not None else (b, a)
    check(loser.proc.returncode != 0, "round %d: the loser exited 0" % rnd, loser.log)
    check(kvt.wait_for(lambda: kvt.can_connect(winner.sock) and kvt.can_connect(winner.admin)
                       or winner.proc.poll() is not None, 30),
          "round %d: the winner does not serve" % rnd, winner.log)
    check(winner.proc.poll() is None, "round %d: both daemons exited" % rnd, winner.log)
    check("another daemon" in loser.logtext(),
          "round %d: the loser does not say why" % rnd, loser.log)
    r = winner.kvctl("status")
    check(r.returncode == 0, "round %d: kvctl status: %s" % (rnd, r.stderr), winner.log)
    check(stat.S_IMODE(os.stat(winner.sock).st_mode) == 0o660, "worker socket mode")
    check(stat.S_IMODE(os.stat(winner.admin).st_mode) == 0o600, "admin socket mode")
    left = [n for n in os.listdir(d) if n.startswith(".kvcached-")]
    check(loser.proc.returncode is not None and "listening on" not in loser.logtext(),
          "round %d: the loser listened" % rnd, loser.log)
    check(not left, "temporary directories left: %s" % left)
    # A daemon killed with SIGKILL: its socket file and lock file stay; the
    # next daemon replaces the one and takes the other.
    winner.proc.send_signal(signal.SIGKILL)
    winner.proc.wait()
    # (Its sockets may accept for a moment after it is gone: wait for the
    # new daemon's word, not for a connection.)
    c = kvt.Daemon(d, *ARGS, wait=False, log="c.log")
    check(c.wait_log("listening on", 30), "after SIGKILL: no new daemon", c.log)
    r = c.kvctl("status")
    check(r.returncode == 0, "after SIGKILL: kvctl status: %s" % r.stderr, c.log)
    c.kill()

kvt.cleanup()
print("ok")
