#!/usr/bin/env python3
"""kvcache.sglang when kvcached is not there, goes away, comes back, is full
or refuses (docs/sglang.md, "Failures"): no call raises or fails a request;
exists finds nothing, a get reports misses and a set reports pages not
stored (SGLang recomputes them), with one clear warning; when the daemon
comes back (started late, or killed and restarted) the same backend stores
again and another SGLang instance finds its pages byte for byte; nothing
stays referenced.

Runs under the SGLang virtual environment (scripts/sglang-env); exits 77
without it."""
import json
import logging
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_env  # noqa: E402

if __name__ == "__main__":
    sglang_env.reexec()

import sglang_storage_common as sc  # noqa: E402

N = 6
KIND, LAYOUT = "mha", "page_first"


class Logs(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, rec):
        self.lines.append(rec.levelname + " " + rec.getMessage())


def main():
    import kvt
    kvt.need_bins()
    d = kvt.tmpdir()
    sock = os.path.join(d, "w.sock")
    logs = Logs()
    logging.getLogger("kvcache.sglang").addHandler(logs)
    logging.getLogger("kvcache.sglang").setLevel(logging.DEBUG)

    hp = sc.host_pool(KIND, LAYOUT)
    sc.fill(hp, sc.seed("restart"))
    b = sc.backend(KIND, LAYOUT, hp, sc.dynamic_extra(sock, timeout_ms=2000))
    want = [sc.page_digest(hp, p) for p in range(1, N + 1)]
    W = sc.indices(range(1, N + 1))

    def all_fail(what):
        ks = sc.keys(what, N)
        kvt.check(b.batch_exists(ks) == 0, f"{what}: exists found pages")
        kvt.check(b.batch_set_v1(ks, W) == [False] * N, f"{what}: a set was reported stored")
        kvt.check(b.batch_get_v1(ks, sc.indices(range(20, 20 + N))) == [False] * N,
                  f"{what}: a get was reported loaded")
        kvt.check(b.batch_get(ks[:1], [hp.get_dummy_flat_data_page()]) == [None],
                  f"{what}: batch_get returned a page")
        kvt.check(b.exists(ks[0]) is False and b.get(ks[0]) is None and
                  b.set(ks[0], hp.get_data_page(PAGE1, flat=True)) is False, what)

    PAGE1 = sc.PAGE

    # 1. No daemon at all: every call answers, none raises.
    all_fail("no-daemon")
    warns = [ln for ln in logs.lines if ln.startswith("WARNING")]
    kvt.check(len(warns) == 1 and "cannot use kvcached" in warns[0],
              "want one warning while the daemon is down: %s" % warns)
    print("ok: no daemon: misses and failed sets, one warning", flush=True)

    # 2. The daemon comes: the same backend stores, another instance loads.
    # The namespace kvt-q may hold two blocks in G1 (step 6).
    conf = os.path.join(d, "q.conf")
    with open(conf, "w") as f:
        f.write("[namespace kvt-q]\nquota_g1 = 8KiB\n")

    def start(log):
        return kvt.Daemon(d, argv0=[kvt.BIN, "--config=" + conf, "--socket=" + sock,
                                    "--pool-size", "16MiB", "--segment-size", "4MiB",
                                    "--page-size", "64KiB"], log=log)

    daemon = start("log")
    env = dict(os.environ, KVT_ADMIN=daemon.admin, KVT_SOCK=daemon.sock)
    os.environ.update(KVT_ADMIN=daemon.admin, KVT_SOCK=daemon.sock)
    ks = sc.keys("first", N)
    kvt.check(kvt.wait_for(lambda: all(b.batch_set_v1(ks, W)), timeout=10),
              "the backend did not store once the daemon was up", daemon.log)
    kvt.check(any("kvcached is back" in ln for ln in logs.lines), "no 'back' log line")

    storage = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "test_sglang_storage.py")
    import test_sglang_storage as ts

    def other(tag, want_json):
        """test_sglang_storage's reader in a process of its own (forked from
        this one when it has no thread, tests/forkchild.py)."""
        sc.run_child(storage, ["get", KIND, LAYOUT, tag, want_json, "{}"], env, daemon.log,
                     roles={"get": ts.role_get}, timeout=300)

    # test_sglang_storage's reader wants keys(tag, 6) with the writer's
    # digests; this backend wrote them from seed("restart").
    other_tag = "first"
    other(other_tag, json.dumps(want))
    kvt.check(sc.refs() == 0, "references held", daemon.log)
    print("ok: daemon started late: stored, found byte-exact by another process",
          flush=True)

    # 3. Full: another client holds every block; sets fail, nothing raises.
    import kvcache
    hog = kvcache.connect(daemon.sock, client_name="kvt-hog")
    name, lay, bb, _ = b._spec("v1")
    hp_pool = hog.register_pool(name, bb, sc.PAGE, dtype="fp16", layout=lay, model=sc.MODEL)
    held = []
    try:
        while True:
            held += hog.alloc(hp_pool, 64)
    except kvcache.KvError as e:
        kvt.check(e.code in (kvcache.ENOSPC, kvcache.EQUOTA), str(e))
    full = sc.keys("full", N)
    kvt.check(b.batch_set_v1(full, W) == [False] * N, "a set reported stored into a full pool")
    kvt.check(b.batch_exists(full) == 0, "pages of a failed set are found")
    hog.release(held)
    hog.close()
    kvt.check(sc.refs() == 0, "references held after a full pool", daemon.log)
    kvt.check(all(b.batch_set_v1(full, W)), "no set once there was room again", daemon.log)
    print("ok: full: sets not stored, nothing held; stored once there is room", flush=True)

    # 4. Killed: misses, failed sets, no exception.
    daemon.kill()
    all_fail("killed")
    print("ok: daemon killed: misses and failed sets", flush=True)

    # 5. Restarted (empty): the same backend stores again, and is shared again.
    daemon2 = start("log2")
    ks2 = sc.keys("second", N)
    kvt.check(kvt.wait_for(lambda: all(b.batch_set_v1(ks2, W)), timeout=10),
              "the backend did not store after the restart", daemon2.log)
    env.update(KVT_ADMIN=daemon2.admin)
    os.environ.update(KVT_ADMIN=daemon2.admin)
    other("second", json.dumps(want))
    # Its own get too, into other pages, byte-exact.
    got = b.batch_get_v1(ks2, sc.indices(range(30, 30 + N)))
    kvt.check(got == [True] * N, f"own get after the restart: {got}")
    kvt.check([sc.page_digest(hp, p) for p in range(30, 30 + N)] == want,
              "own get after the restart: bytes differ")
    kvt.check(sc.refs() == 0, "references held after the restart", daemon2.log)
    print("ok: daemon restarted: stored again, found byte-exact by another process",
          flush=True)

    # 6. Refusing: a tenant at its G1 quota (EQUOTA) gets failed sets.
    q = sc.backend(KIND, LAYOUT, hp, sc.dynamic_extra(sock, namespace="kvt-q"))
    kvt.check(q.batch_set_v1(ks, W) == [False] * N, "a set past the quota reported stored")
    kvt.check(q.counters["daemon_errors"] == 0, "the quota's refusal was not what failed the set")
    kvt.check(q.batch_exists(ks) == 0, "pages of a refused set are found")
    kvt.check(sc.refs() == 0, "references held after a refusal", daemon2.log)
    q.close()

    # 7. Slow: a daemon that stops answering (SIGSTOP). With a binding that
    # has deadlines (kvcache.Connection.set_timeout), every call returns by
    # its timeout_ms as a miss or a failed set; after SIGCONT the backend
    # serves again and nothing stays referenced. Without one (a binding from
    # before deadlines) the calls would wait for the daemon: not tried.
    import kvcache
    if hasattr(kvcache.Connection, "set_timeout"):
        s_ = sc.backend(KIND, LAYOUT, hp, sc.dynamic_extra(sock, timeout_ms=300))
        kvt.check(s_.batch_exists(ks2) == N, "the slow-daemon backend does not find the pages")
        kvt.check(s_._local.c.conn.timeout_ms == 300, "the backend's timeout_ms is not the "
                  "connection's deadline")
        daemon2.signal(signal.SIGSTOP)
        try:
            kvt.check(s_.batch_exists(ks2) == 0, "exists found pages on a stopped daemon")
            kvt.check(s_.batch_get_v1(ks2, sc.indices(range(40, 40 + N))) == [False] * N,
                      "a get was reported loaded from a stopped daemon")
            kvt.check(s_.batch_set_v1(sc.keys("stopped", N), W) == [False] * N,
                      "a set was reported stored on a stopped daemon")
        finally:
            daemon2.signal(signal.SIGCONT)
        kvt.check(kvt.wait_for(lambda: s_.batch_get_v1(ks2, sc.indices(range(40, 40 + N)))
                               == [True] * N, timeout=10),
                  "no get after the daemon answered again", daemon2.log)
        kvt.check([sc.page_digest(hp, p) for p in range(40, 40 + N)] == want,
                  "bytes differ after the stop")
        kvt.check(sc.refs() == 0, "references held after the stop", daemon2.log)
        s_.close()
        print("ok: a stopped daemon: every call returned by its deadline as a miss or a failed "
              "set; served again after SIGCONT", flush=True)
    else:
        print("ok: (no deadlines in this binding: the stopped-daemon step is not run)",
              flush=True)
    b.close()
    kvt.check(not [c for c in sc.clients() if c.get("pid") == os.getpid()],
              "connections left open after close()", daemon2.log)
    print("ok: refused (quota): sets not stored; close() leaves no session", flush=True)


if __name__ == "__main__":
    import kvt
    try:
        main()
    finally:
        kvt.cleanup()   # the daemons it started
