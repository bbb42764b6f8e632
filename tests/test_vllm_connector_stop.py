#!/usr/bin/env python3
"""KvcachedConnector's deadlines with a stopped daemon (docs/vllm.md,
"Deadlines"), with vLLM 0.33's real Scheduler and the worker side against a
real kvcached: the daemon SIGSTOPped between the scheduler's lookup and the
worker's load - the load reports its blocks as load errors (vLLM
recomputes them, the bytes are checked) once timeout_ms has passed, the
step's saves are skipped, a new request's lookup answers no hit; after
SIGCONT loads work again; stopped once more, shutdown returns; and nothing
is referenced in the daemon afterwards (kvctl clients).

Without deadlines on the connector's calls, the load (and shutdown) would
wait for the daemon for ever: this test's child would not end.

Runs under the vLLM virtual environment (scripts/vllm-env); exits 77
without it. Exit 0 pass, 1 fail, 77 skip."""
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_connector_common as vc  # noqa: E402

BS = vc.BS
TIMEOUT_MS = 400
P1 = vc.SYSTEM + vc.user(40)
P2 = [900 - t for t in vc.SYSTEM] + vc.user(41)
P3 = [150 + t // 2 for t in vc.SYSTEM] + vc.user(42)


def role_fill(sock, admin, pid):
    f = vc.Instance(sock, layout="LBNHC")
    f.add("fill-1", P1)
    f.add("fill-2", P2)
    f.add("fill-3", P3)
    f.run()
    assert f.stats.get("saved_blocks", 0) >= 18, f.stats
    vc.out(stats=f.stats)
    f.close()


def _probe(client):
    """Whether a call on client's connection gets through (a lookup of a
    hash nothing has: no reference taken)."""
    import kvcache
    c = client.get()
    if c is None:
        return False
    try:
        c.lookup(client.pool, [b"\x5a" * 32])
        return True
    except kvcache.KvError:
        return False


def _wait(cond, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def role_stop(sock, admin, pid):
    daemon = int(pid)
    kvctl = os.environ["KVCTL_BIN"]
    i = vc.Instance(sock, layout="LBNHC", extra={
        "timeout_ms": TIMEOUT_MS, "lookup_timeout_ms": 10000, "lookup_deadline_ms": 60000})
    w = i.worker.connector_worker
    s = i.conn.connector_scheduler
    assert w.client.deadlines and w.client.conn.timeout_ms == TIMEOUT_MS, "no deadline"
    stopped = []
    real_load = i.worker.start_load_kv
    took = []

    def start_load_kv(fc, **kw):
        # The scheduler's lookup found the blocks; the daemon stops before
        # the worker loads them.
        meta = i.worker._get_connector_metadata()
        if meta.loads and not stopped:
            os.kill(daemon, signal.SIGSTOP)
            stopped.append(1)
        t0 = time.monotonic()
        real_load(fc, **kw)
        took.append(time.monotonic() - t0)
    i.worker.start_load_kv = start_load_kv
    try:
        i.add("s-1", P1)
        i.run()
        assert stopped, "no load was planned"
        want_err = (len(P1) - 1) // BS
        assert i.load_errors == want_err, (i.load_errors, want_err)
        assert i.stats.get("loaded_blocks", 0) == 0, i.stats
        # The scheduler side: a new request's lookup ends in no hit; the
        # blocks it computes are skipped, not saved.
        i.add("s-2", P2 + [7])
        i.run()
        assert i.first_sched["s-2"] == len(P2) + 1, i.first_sched
        assert i.stats.get("save_failures", 0) >= len(P2) // BS, i.stats
        assert i.stats.get("saved_blocks", 0) == 0, i.stats
        print("load under SIGSTOP took %.2f s (timeout_ms %d)" % (max(took), TIMEOUT_MS),
              flush=True)
        # A bound against a hang (the library's default deadline is 60 s),
        # not a speed: the load ends at its deadline plus scheduling noise.
        assert max(took) < 20, "the load waited %.1f s for a stopped daemon" % max(took)
    finally:
        os.kill(daemon, signal.SIGCONT)
    # After SIGCONT: each side's next call gets through (the library
    # reconnects, backing off), then loads work again.
    assert _wait(lambda: _probe(w.client)), "the worker's connection did not come back"
    assert _wait(lambda: s._ops.submit(_probe, s.client).result()), \
        "the scheduler's connection did not come back"
    # P1 and P2 are in this engine's own prefix cache now; P3 only in kvcached.
    i.add("s-3", P3)
    i.run()
    got = i.stats.get("loaded_blocks", 0)
    assert got == (len(P3) - 1) // BS, i.stats
    assert i.first_sched["s-3"] == len(P3) - got * BS, i.first_sched
    assert i.held() == 0
    assert vc.kvctl_refs(kvctl, admin, os.getpid()) == 0, "references left after SIGCONT"
    # Shutdown of both sides while the daemon is stopped returns.
    os.kill(daemon, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        i.close()
        shut = time.monotonic() - t0
        assert shut < 20, "shutdown waited %.1f s for a stopped daemon" % shut
    finally:
        os.kill(daemon, signal.SIGCONT)
    vc.out(load_s=max(took), shutdown_s=shut, loaded_after=got, stats=i.stats)


def main():
    import kvt
    kvt.need_bins()
    d = kvt.tmpdir()
    daemon = kvt.Daemon(d, "--pool-size", "8MiB", "--segment-size", "4MiB", "--page-size",
                        "64KiB")
    pid = str(daemon.proc.pid)

    def run(role, *rest):
        try:
            return vc.run_child(__file__, [role, daemon.sock, daemon.admin, pid, *rest],
                                daemon.log, timeout=300)
        finally:
            daemon.signal(signal.SIGCONT)

    run("fill")
    run("stop")
    # Nothing referenced once the daemon has seen the stopped children's
    # connections close.
    def no_refs():
        r = daemon.kvctl("-o", "json", "clients")
        kvt.check(r.returncode == 0, "kvctl clients: " + r.stderr, daemon.log)
        return sum(c.get("refs", 0) for c in json.loads(r.stdout).get("clients", [])) == 0
    kvt.check(kvt.wait_for(no_refs, timeout=30), "references left in the daemon", daemon.log)
    daemon.kill()
    print("PASS")
    kvt.cleanup()
    sys.exit(0)


if __name__ == "__main__":
    vc.main_or_child(main, {"fill": role_fill, "stop": role_stop})
