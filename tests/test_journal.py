#!/usr/bin/env python3
"""Journald logging. When stderr is the journal stream ($JOURNAL_STREAM names
fd 2), lines go to the journal with PRIORITY, CODE_FILE/LINE/FUNC,
SYSLOG_IDENTIFIER and, for a session's request, KV_SESSION and KV_NAMESPACE.

The journal is faked: in a private mount namespace (unshare -m, needs
CAP_SYS_ADMIN; skipped without it) a tmpfs over /run/systemd holds a datagram
socket at /run/systemd/journal/socket that this test reads, in journald's
native format. Without a journal socket at all, lines go to stderr with a
"<N>" priority prefix, which journald reads too."""
import os
import shutil
import socket
import struct
import subprocess
import sys

import kvt
from kvt import check

kvt.need_bins()
if "-systemd" in subprocess.run([kvt.BIN, "--version"], capture_output=True, text=True).stdout:
    kvt.skip("built without libsystemd")
JSOCK = "/run/systemd/journal/socket"


def parse(data):
    """journald's native protocol: KEY=value lines, or KEY\\n le64 len, data, \\n."""
    fields, i = {}, 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            k, v = line.split(b"=", 1)
            i = nl + 1
        else:
            k = line
            (n,) = struct.unpack_from("<Q", data, nl + 1)
            v = data[nl + 9:nl + 9 + n]
            i = nl + 9 + n + 1
        fields[k.decode()] = v.decode(errors="replace")
    return fields


def run_daemon(d, stderr_path, *extra):
    """The daemon with stderr on a file that JOURNAL_STREAM names."""
    errf = open(stderr_path, "wb")
    st = os.fstat(errf.fileno())
    env = dict(os.environ, JOURNAL_STREAM="%d:%d" % (st.st_dev, st.st_ino))
    for k in ("KVCACHED_SOCKET", "KVCACHED_ADMIN_SOCKET", "NOTIFY_SOCKET", "WATCHDOG_USEC"):
        env.pop(k, None)
    sock = os.path.join(d, "w.sock")
    p = subprocess.Popen([kvt.BIN, "--config=", "--socket=" + sock, "--pool-size=16MiB",
                          "--segment-size=4MiB", "--log-level=debug", *extra],
                         stdin=subprocess.DEVNULL, stdout=errf, stderr=errf, env=env)
    kvt._cleanup.append(lambda: p.poll() is None and (p.kill(), p.wait()))
    check(kvt.wait_for(lambda: kvt.can_connect(os.path.join(d, "w-admin.sock")) or
                       p.poll() is not None), "daemon did not start", stderr_path)
    return p, sock


def inner():
    """In the private mount namespace: a fake journal."""
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/run/systemd"], check=True)
    os.makedirs("/run/systemd/journal")
    j = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    j.bind(JSOCK)
    d = kvt.tmpdir()
    err = os.path.join(d, "stderr")
    p, sock = run_daemon(d, err)
    w = kvt.Worker(sock, "tenant-a")
    check(w.ok() and w.cmd("pool p 65536").startswith("ok"), "worker: " + w.hello, err)
    session = w.hello.split()[1]
    w.quit()
    p.terminate()
    check(p.wait(10) == 0, "exit status", err)
    # The daemon has exited, and a datagram is queued on this socket by the
    # send itself: everything it logged is here, read until nothing is left.
    msgs = []
    j.setblocking(False)
    try:
        while True:
            msgs.append(parse(j.recv(1 << 20)))
    except BlockingIOError:
        pass
    check(msgs, "nothing reached the journal", err)
    for m in msgs:
        for k in ("MESSAGE", "PRIORITY", "SYSLOG_IDENTIFIER"):
            check(k in m, "field %s missing in %s" % (k, m), err)
        check(m["SYSLOG_IDENTIFIER"] == "kvcached", "SYSLOG_IDENTIFIER: %s" % m, err)
    start = [m for m in msgs if m["MESSAGE"].startswith("listening on")]
    check(start, "no 'listening on' message: %s" % msgs, err)
    m = start[0]
    check(m["PRIORITY"] == "6" and m.get("CODE_FILE") == "daemon/server.c" and
          m.get("CODE_FUNC") == "kv_server_init" and m.get("CODE_LINE", "").isdigit(),
          "location fields: %s" % m, err)
    reg = [m for m in msgs if "pool" in m["MESSAGE"] and m.get("KV_SESSION") == session]
    check(reg, "no message of session %s with KV_SESSION: %s" % (session, msgs), err)
    check(reg[0].get("KV_NAMESPACE") == "tenant-a" and reg[0]["PRIORITY"] == "7",
          "session fields: %s" % reg[0], err)
    check(os.path.getsize(err) == 0, "lines went to stderr too: " + open(err).read(), err)
    print("ok: %d journal messages with fields, e.g. %s" % (len(msgs), reg[0]))
    kvt.cleanup()


if os.environ.get("KVT_JOURNAL_INNER"):
    inner()
    sys.exit(0)

done = 0
# Without any journal socket: "<N>" prefixes on stderr.
if not os.path.exists(JSOCK):
    d = kvt.tmpdir()
    err = os.path.join(d, "stderr")
    p, sock = run_daemon(d, err)
    p.terminate()
    check(p.wait(10) == 0, "exit status", err)
    text = open(err).read()
    check("<6>listening on" in text, "no <6> prefix on stderr: " + text, err)
    print("ok: <N> prefixes without a journal socket")
    done += 1

# A fake journal in a private mount namespace.
if shutil.which("unshare") and os.path.isdir("/run/systemd"):
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                       capture_output=True)
    if r.returncode == 0:
        r = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable,
                            os.path.abspath(__file__)],
                           env=dict(os.environ, KVT_JOURNAL_INNER="1"))
        check(r.returncode == 0, "fake journal run failed (%d)" % r.returncode)
        done += 1
    else:
        print("fake journal skipped: unshare -m not allowed here")
kvt.cleanup()
if not done:
    kvt.skip("no way to check the journal here")
