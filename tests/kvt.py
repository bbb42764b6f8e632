"""Helpers for the Python integration tests: a real kvcached on private
sockets, kvt_worker processes, kvctl. Exit codes: 0 pass, 1 fail, 77 skip.

Paths come from the environment meson sets: KVCACHED_BIN, KVCTL_BIN,
KVT_WORKER_BIN, KVDEMO_BIN, and MESON_SOURCE_ROOT for the source tree."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

BIN = os.environ.get("KVCACHED_BIN")
KVCTL = os.environ.get("KVCTL_BIN")
WORKER = os.environ.get("KVT_WORKER_BIN")
SRC = os.environ.get("MESON_SOURCE_ROOT",
                     os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_cleanup = []


def skip(why):
    print("SKIP:", why)
    sys.exit(77)


def fail(why, log=None):
    print("FAIL:", why, file=sys.stderr)
    if log and os.path.exists(log):
        print("---- daemon log ----", file=sys.stderr)
        with open(log, errors="replace") as f:
            sys.stderr.write(f.read())
    cleanup()
    sys.exit(1)


def check(cond, why, log=None):
    if not cond:
        fail(why, log)


def cleanup():
    while _cleanup:
        fn = _cleanup.pop()
        try:
            fn()
        except Exception:
            pass


def need_bins():
    if not BIN or not KVCTL or not WORKER:
        skip("KVCACHED_BIN, KVCTL_BIN, KVT_WORKER_BIN not set (run through meson test)")


def tmpdir():
    d = tempfile.mkdtemp(prefix="kvt-py.")
    _cleanup.append(lambda: shutil.rmtree(d, ignore_errors=True))
    return d


def can_connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def wait_for(cond, timeout=10.0, step=0.02):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()


class Daemon:
    """kvcached on dir/w.sock and dir/w-admin.sock, logging to dir/log (or
    to dir/<log>)."""

    def __init__(self, d, *args, env=None, wait=True, argv0=None, log="log"):
        self.dir = d
        self.sock = os.path.join(d, "w.sock")
        self.admin = os.path.join(d, "w-admin.sock")
        self.log = os.path.join(d, log)
        e = dict(os.environ)
        e.pop("KVCACHED_SOCKET", None)
        e.pop("KVCACHED_ADMIN_SOCKET", None)
        e.pop("NOTIFY_SOCKET", None)
        e.pop("WATCHDOG_USEC", None)
        e.pop("JOURNAL_STREAM", None)
        if env:
            e.update(env)
        cmd = argv0 or [BIN, "--config=", "--socket=" + self.sock]
        self.logf = open(self.log, "ab")
        self.proc = subprocess.Popen(cmd + list(args), stdin=subprocess.DEVNULL,
                                     stdout=self.logf, stderr=subprocess.STDOUT, env=e)
        _cleanup.append(self.kill)
        if wait:
            check(wait_for(lambda: can_connect(self.admin) or self.proc.poll() is not None),
                  "daemon did not start", self.log)
            check(self.proc.poll() is None, "daemon exited at start: %s" % self.proc.returncode,
                  self.log)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def logtext(self):
        self.logf.flush()
        with open(self.log, errors="replace") as f:
            return f.read()

    def wait_log(self, text, timeout=10.0):
        return wait_for(lambda: text in self.logtext(), timeout)

    def kvctl(self, *args, admin=True):
        return kvctl("-s", self.admin if admin else self.sock, *args)

    def metric(self, name, missing=False):
        """The value of one sample in `kvctl metrics` (a float); fails the
        test when there is none, or returns missing when that is not False
        (a kvcached from before the metric)."""
        r = self.kvctl("metrics")
        check(r.returncode == 0, "kvctl metrics: %s" % r.stderr, self.log)
        for line in r.stdout.splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        if missing is not False:
            return missing
        fail("no %s in kvctl metrics" % name, self.log)

    def rss(self, field="VmRSS"):
        """The daemon's resident memory in bytes (0 once it has gone).
        field="RssAnon": its own heap and stacks only, without the pool's
        shared pages, which a worker thread of the host backend populates
        (MADV_POPULATE_WRITE) at its own pace after the pool is made: a
        bound on what requests grow is checked on this one."""
        try:
            with open("/proc/%d/status" % self.proc.pid) as f:
                for line in f:
                    if line.startswith(field + ":"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def tiers_idle(self):
        """True when no tier copy or disk I/O is in flight (kvctl status).
        Demotions and G2's write-back to G3 go on after a workload's last
        request: what is in which medium is known only once they are done."""
        r = self.kvctl("-o", "json", "status")
        check(r.returncode == 0, "kvctl status: %s" % r.stderr, self.log)
        return not any(t["inflight"] for t in json.loads(r.stdout)["tiers"])

    def wait_tiers_idle(self, timeout=60):
        """Waits until tiers_idle(). A workload that must leave blocks in
        every tier paces itself with this: an Alloc that finds G1 full
        while demotion lags (a loaded machine) drops the oldest cached
        blocks instead of waiting for disk I/O (docs/tiers.md), so what
        reaches G2 and G3 would depend on the machine's speed."""
        check(wait_for(self.tiers_idle, timeout=timeout, step=0.02),
              "the tiers did not become idle in %d s" % timeout, self.log)


def events_daemon(d, *args, **kw):
    """A Daemon publishing KV events (args name the endpoints): started and
    waited for; the test is skipped (77) when kvcached was built without
    KV events."""
    daemon = Daemon(d, *args, wait=False, **kw)
    check(wait_for(lambda: can_connect(daemon.admin) or daemon.proc.poll() is not None),
          "daemon did not start", daemon.log)
    if daemon.proc.poll() is not None:
        if "built without KV events" in daemon.logtext():
            skip("kvcached built without KV events")
        fail("daemon exited at start", daemon.log)
    return daemon


def kvctl(*args, timeout=30):
    return subprocess.run([KVCTL, *args], capture_output=True, text=True, timeout=timeout)


class Worker:
    """A kvt_worker process: one connection driven line by line."""

    def __init__(self, sock, ns=None):
        self.proc = subprocess.Popen([WORKER, sock] + ([ns] if ns else []),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     bufsize=1)
        _cleanup.append(self.kill)
        self.hello = self.proc.stdout.readline().strip()

    def ok(self):
        return self.hello.startswith("ready")

    def cmd(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def quit(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
            self.proc.wait(timeout=10)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
