"""Children of a test's own process, forked rather than started as a new
python (tests/vllm_connector_common.py, tests/sglang_storage_common.py).

The tests that run several engine instances in several processes (separate
connections to the daemon, pids, references) used to start each one as
`python SCRIPT --child ROLE ARGS...`, and each such python imported torch and
vLLM or SGLang again: about 8 s of CPU each on the 2-CPU CI machine, most of
those tests' time. Here the test's process imports them once (the caller's
preload) and start_child() os.fork()s a child that runs roles[ROLE](ARGS...).

Each child is still its own process: its own pid; its own uid and gid when
asked (set after the fork, before the role runs); its own environment
(os.environ replaced when env is given); its stdin, stdout and stderr on
pipes to the parent; and its own connections to the daemon, which the role
makes after the fork (the parent holds none that a child uses; a child
closes the other running children's pipes). It ends with os._exit: nothing
of the parent's (its daemons, its temporary folders, kvt's clean-up) runs
in it.

A fork is only safe without threads: start_child forks only while this
process has one thread (the kernel's count, /proc/self/task: no OpenBLAS
or OpenMP pool started, nothing of Python's), and otherwise, or when the
script is not the running one and no roles are given, starts the child by
exec as before (and says so).

Every wait has a deadline: Child.readline and Child.finish take one, and a
child past it is killed."""
import os
import selectors
import signal
import subprocess
import sys
import time

_roles = None           # the running script's roles (set_roles)
_parent_fds = set()     # this process's ends of running children's pipes


def set_roles(roles):
    """The running script's roles: a dict ROLE -> function(*ARGS), or one
    function(ROLE, *ARGS)."""
    global _roles
    _roles = roles


def threads():
    """This process's threads (the kernel's count, not only Python's)."""
    return len(os.listdir("/proc/self/task"))


def run_role(argv, roles=None):
    """Runs roles[ROLE](ARGS...) for argv = [ROLE, ARGS...]; returns the
    exit status: 0, or 1 after a failed assertion (its traceback and a FAIL
    line)."""
    roles = roles if roles is not None else _roles
    try:
        if callable(roles):
            roles(*argv)
        else:
            roles[argv[0]](*argv[1:])
    except AssertionError as e:
        import traceback
        traceback.print_exc()
        print("FAIL:", e, file=sys.stderr, flush=True)
        return 1
    return 0


class Child:
    """A running child (forked or exec'd): its pid, its stdin (send) and its
    output (readline, finish), every wait under a deadline."""

    def __init__(self, pid, fin, fout, ferr, proc=None, forked=True):
        self.pid = pid
        self.forked = forked
        self.proc = proc
        self.fin = fin
        self.out, self.err = fout, ferr
        self.bufs = {fout: bytearray(), ferr: bytearray()}
        self.open = {fout, ferr}
        self.pidfd = os.pidfd_open(pid) if proc is None else None
        self.returncode = None
        for fd in (fin, fout, ferr, self.pidfd):
            if fd is not None:
                _parent_fds.add(fd)

    def _close(self, fd):
        _parent_fds.discard(fd)
        os.close(fd)

    def _pump(self, deadline, until):
        """Reads both pipes (and then waits for the exit) until until() or
        the deadline; False on the deadline."""
        with selectors.DefaultSelector() as sel:
            while not until():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if not self.open:
                    if not self._reap(left):
                        return False
                    continue
                keys = list(self.open)
                for fd in keys:
                    sel.register(fd, selectors.EVENT_READ)
                for k, _ in sel.select(left):
                    b = os.read(k.fd, 65536)
                    if b:
                        self.bufs[k.fd] += b
                    else:
                        self.open.discard(k.fd)
                        self._close(k.fd)
                for fd in keys:
                    sel.unregister(fd)
        return True

    def _reap(self, left):
        """Waits up to left seconds for the child's exit status."""
        import select
        if self.proc is not None:
            try:
                self.returncode = self.proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                return False
            return True
        if not select.select([self.pidfd], [], [], left)[0]:
            return False
        _, st = os.waitpid(self.pid, 0)
        self.returncode = os.waitstatus_to_exitcode(st)
        self._close(self.pidfd)
        self.pidfd = None
        return True

    def send(self, text):
        """Writes text to the child's stdin."""
        os.write(self.fin, text.encode())

    def readline(self, timeout=600):
        """The child's next line of stdout ('' at its end or after timeout
        seconds)."""
        buf = self.bufs[self.out]
        self._pump(time.monotonic() + timeout,
                   lambda: b"\n" in buf or self.out not in self.open)
        i = buf.find(b"\n")
        n = len(buf) if i < 0 else i + 1
        ln = bytes(buf[:n]).decode(errors="replace")
        del buf[:n]
        return ln

    def finish(self, timeout=600):
        """Closes its stdin, reads its output to the end and waits for its
        exit; returns (exit status, stdout, stderr), the status None when it
        was killed at the deadline."""
        if self.fin is not None:
            self._close(self.fin)
            self.fin = None
        if not self._pump(time.monotonic() + timeout, lambda: self.returncode is not None):
            self.kill()
        o, e = (bytes(self.bufs[fd]).decode(errors="replace") for fd in (self.out, self.err))
        return self.returncode, o, e

    def kill(self):
        """SIGKILL, and reaped; its status None."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for fd in list(self.open):
            self._close(fd)
        self.open.clear()
        if self.proc is not None:
            self.proc.wait()
        elif self.pidfd is not None:
            os.waitpid(self.pid, 0)
            self._close(self.pidfd)
            self.pidfd = None
        self.returncode = None


def _exec(script, args, env, user):
    ids = {} if user is None else {"user": user, "group": user, "extra_groups": []}
    p = subprocess.Popen([sys.executable, script, "--child", *args], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, **ids)
    fds = [os.dup(f.fileno()) for f in (p.stdin, p.stdout, p.stderr)]
    for f in (p.stdin, p.stdout, p.stderr):
        f.close()
    return Child(p.pid, *fds, proc=p, forked=False)


def start_child(script, args, env=None, user=None, roles=None):
    """Starts `script --child ARGS...` as a child: forked from this process
    running roles[ARGS[0]](ARGS[1:]...) (roles: the given ones, else
    set_roles' when script is the running one) while this process has one
    thread; else by exec under this python. As uid and gid user when given
    (no supplementary groups), with environment env (else this one's).
    Returns its Child."""
    if roles is None and os.path.realpath(script) == os.path.realpath(sys.argv[0]):
        roles = _roles
    if roles is None:
        return _exec(script, args, env, user)
    n = threads()
    if n != 1:
        print("start_child: %d threads in this process, starting %s by exec" % (n, args[:1]),
              flush=True)
        return _exec(script, args, env, user)
    sys.stdout.flush()
    sys.stderr.flush()
    pipes = [os.pipe() for _ in range(3)]
    pid = os.fork()
    if pid == 0:                                   # the child
        code = 1
        try:
            for fd in _parent_fds:
                os.close(fd)
            _parent_fds.clear()
            for i, (r, w) in enumerate(pipes):
                os.dup2(r if i == 0 else w, i)
                os.close(r)
                os.close(w)
            if "kvt" in sys.modules:               # the parent's daemons and folders
                sys.modules["kvt"]._cleanup.clear()
            if user is not None:
                os.setgroups([])
                os.setgid(user)
                os.setuid(user)
            if env is not None:
                os.environ.clear()
                os.environ.update(env)
            sys.argv = [script, "--child", *args]
            code = run_role(list(args), roles)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    os.close(pipes[0][0])
    os.close(pipes[1][1])
    os.close(pipes[2][1])
    return Child(pid, pipes[0][1], pipes[1][0], pipes[2][0])


def preload(modules):
    """Imports modules in this process, the one children are forked from,
    so that each child has them without importing them again (they start no
    thread and run no torch op at import)."""
    import importlib
    for m in modules:
        importlib.import_module(m)


def run(script, args, log, what, timeout=600, env=None, user=None, roles=None):
    """Runs `script --child ARGS...` (start_child) to its end; returns its
    last RESULT line decoded and its stdout. Fails the test with the child's
    output and the daemon's log (log) when it exits non-zero, prints no
    RESULT line or runs past timeout seconds (then killed); what names it,
    with its pid, there."""
    import json

    import kvt
    c = start_child(script, args, env=env, user=user, roles=roles)
    rc, o, e = c.finish(timeout)
    res = [ln[7:] for ln in o.splitlines() if ln.startswith("RESULT ")]
    what = "%s (pid %d%s)" % (what, c.pid, "" if c.forked else ", exec")
    if rc != 0 or not res:
        sys.stderr.write(o[-4000:] + e[-8000:])
        kvt.fail("%s failed (exit %s%s)" % (what, rc, ", killed after %d s" % timeout
                                               if rc is None else ""), log)
    return json.loads(res[-1]), o, what
