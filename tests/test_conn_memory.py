#!/usr/bin/env python3
"""Connection memory per uid (issue 29, item 6 of its attack list): a real
daemon with max_memory_per_uid 24 MiB; uid A opens 16 connections and
sends each a partial frame of 3 MiB (a header announcing 4 MiB, then never
the rest), which the daemon must buffer: without a bound, 48 MiB.

- The daemon's connection buffers (kvcached_connection_buffer_bytes) stay
  within the bound; A's newest connections are the ones closed, with a
  logged reason naming max_memory_per_uid, and counted
  (kvcached_connection_memory_closes_total); A's oldest ones stay open.
- Uid B, connecting while A holds its share, is served (Hello, a pool, an
  allocation) and none of its connections is closed.
- Once A's connections go, the buffers are back to (about) nothing.
As root, A and B are two uids (workers setuid() to them); otherwise A is
this test's uid and B is skipped."""
import os
import socket
import struct
import subprocess
import sys

import kvt
from kvt import check

kvt.need_bins()
ROOT = os.geteuid() == 0
UID_A, UID_B = (54321, 54322) if ROOT else (os.getuid(), None)
MIB = 1 << 20
BOUND = 24 * MIB
CONNS = 16

d = kvt.tmpdir()
os.chmod(d, 0o755)
daemon = kvt.Daemon(d, "--max-memory-per-uid=24MiB", "--max-connection-memory=1GiB",
                    "--socket-mode=0666", "--frame-timeout=5min")


def as_uid(uid):
    return (lambda: (os.setgid(uid), os.setuid(uid))) if ROOT and uid != os.getuid() else None


# uid A: CONNS connections, each a frame header of 4 MiB then 3 MiB of it.
ATTACK = r'''
import socket, struct, sys, time
sock, n = sys.argv[1], int(sys.argv[2])
conns = []
hdr = struct.pack("<IHH", 4 * 1024 * 1024 - 64, 0, 0x4B56)
for i in range(n):
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(sock)
    conns.append(c)
    try:
        c.sendall(hdr)
        c.sendall(b"\0" * (3 * 1024 * 1024))
    except OSError:
        pass   # closed by the daemon while sending: counted below
print("sent", flush=True)
sys.stdin.readline()   # "count": how many are still open
def open_(c):
    c.setblocking(False)
    try:
        return c.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
print(" ".join("1" if open_(c) else "0" for c in conns), flush=True)
sys.stdin.readline()
'''
a = subprocess.Popen([sys.executable, "-c", ATTACK, daemon.sock, str(CONNS)],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                     preexec_fn=as_uid(UID_A))
kvt._cleanup.append(a.kill)
check(a.stdout.readline().strip() == "sent", "the attacker did not finish sending", daemon.log)
check(kvt.wait_for(lambda: daemon.metric("kvcached_connection_memory_closes_total") >= 1, 20),
      "no connection closed over max_memory_per_uid", daemon.log)
held = daemon.metric("kvcached_connection_buffer_bytes")
print("uid %d: %d partial frames of 3 MiB sent; the daemon holds %.1f MiB of buffers (bound "
      "%d MiB), %d connections closed" % (UID_A, CONNS, held / MIB, BOUND // MIB,
                                          daemon.metric("kvcached_connection_memory_closes_total")))
check(held <= BOUND + MIB, "buffers %d past the bound %d" % (held, BOUND), daemon.log)
a.stdin.write("count\n")
a.stdin.flush()
state = a.stdout.readline().split()
check(len(state) == CONNS, "attacker's answer: %s" % state)
alive = [s == "1" for s in state]
print("uid %d's connections, oldest first, open: %s" % (UID_A, "".join(state)))
check(alive[0] and alive[1], "the oldest connections were closed", daemon.log)
# The closed ones are the newest: once one is closed, none after it is open
# ... except that a closed connection gives room back, so a later one may
# fit again: what must hold is that every closed one was the newest of A's
# at its close. The log names the bound each time.
check(not all(alive), "no connection of uid A was closed", daemon.log)
check(daemon.wait_log("max_memory_per_uid"), "no log line names max_memory_per_uid", daemon.log)
check("uid %d's connections hold" % UID_A in daemon.logtext(), "the log names uid A", daemon.log)

if UID_B is not None:
    w = subprocess.Popen([kvt.WORKER, daemon.sock], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, bufsize=1, preexec_fn=as_uid(UID_B))
    kvt._cleanup.append(w.kill)
    hello = w.stdout.readline().strip()
    check(hello.startswith("ready"), "uid B: %s" % hello, daemon.log)
    for cmd in ("pool b 65536", "alloc 4", "release", "ping"):
        w.stdin.write(cmd + "\n")
        w.stdin.flush()
        out = w.stdout.readline().strip()
        check(out.startswith("ok"), "uid B: %s: %s" % (cmd, out), daemon.log)
    check("uid %d's connections hold" % UID_B not in daemon.logtext(), "uid B was charged",
          daemon.log)
    w.stdin.write("quit\n")
    w.stdin.flush()
    w.wait(timeout=10)
    print("uid %d: served (Hello, a pool, an allocation) beside uid %d's share" % (UID_B, UID_A))
else:
    print("not root: the second uid is not tried")

a.stdin.write("bye\n")
a.stdin.flush()
a.wait(timeout=10)
check(kvt.wait_for(lambda: daemon.metric("kvcached_connection_buffer_bytes") < MIB, 20),
      "buffers not given back: %d" % daemon.metric("kvcached_connection_buffer_bytes"), daemon.log)
print("ok: buffers back to %d bytes after uid %d's connections closed"
      % (daemon.metric("kvcached_connection_buffer_bytes"), UID_A))
daemon.kill()
