#!/usr/bin/env python3
"""KvcachedConnector with vLLM 0.33's real Scheduler against a real kvcached
(docs/vllm.md): two vLLM instances in two processes share a system prompt
through the daemon, B scheduling only the tokens beyond A's sealed prefix
(with another KV layout, byte-exact); cache salt and LoRA keep prefixes
apart; A's counters reach vLLM's Prometheus metrics; A's saves reach
kvcached's KV events with the request's LoRA and extra keys as vLLM's own
BlockStored has them; kv_producer only saves,
kv_consumer only loads; preemption and abort leave no reference held (kvctl
clients); the daemon killed in the middle: both instances go on,
recomputing.

Runs under the vLLM virtual environment (scripts/vllm-env); exits 77
without it. Exit 0 pass, 1 fail, 77 skip."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_connector_common as vc  # noqa: E402

BS = vc.BS
S = len(vc.SYSTEM)


def role_a(sock, admin):
    """Instance A: computes and saves; then leaves (its references go with
    its connections, its sealed blocks stay cached)."""
    a = vc.Instance(sock, layout="LBNHC")
    a.add("a-plain", vc.SYSTEM + vc.user(1))
    a.add("a-salt", vc.SYSTEM + vc.user(1), salt="tenant-1")
    a.add("a-lora", vc.SYSTEM + vc.user(1), lora="adapter-1")
    a.run()
    assert a.stats.get("saved_blocks", 0) > 0, a.stats
    assert a.held() == 0
    # The counters on vLLM's /metrics: vLLM's own KVConnectorProm (what its
    # Prometheus stat logger builds) fed the stats this engine reported.
    import prometheus_client
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorProm
    prom = KVConnectorProm(a.conn._vllm_config, ["model_name", "engine"], {0: ["tiny", "0"]})
    prom.observe(dict(a.stats), 0)
    text = prometheus_client.generate_latest().decode()
    line = 'vllm:kvcached_saved_blocks_total{engine="0",model_name="tiny"} %.1f' % (
        a.stats["saved_blocks"])
    assert line in text, [ln for ln in text.splitlines() if "kvcached" in ln][:20]
    vc.out(first=a.first_sched, stats=a.stats)
    a.close()


def role_b(sock, admin):
    """Instance B (another process, another layout with the same bytes):
    loads A's prefix and checks what it schedules."""
    kvctl = os.environ["KVCTL_BIN"]
    b = vc.Instance(sock, layout="BLNHC", batched=1024)
    full = vc.SYSTEM + vc.user(1)          # 104 tokens: 6 full blocks before the last token
    b.add("b-new-user", vc.SYSTEM + vc.user(2))
    b.add("b-same", full)
    b.add("b-salt-same", full, salt="tenant-1")
    b.add("b-salt-other", full, salt="tenant-2")
    b.add("b-lora-same", full, lora="adapter-1")
    b.add("b-lora-other", full, lora="adapter-2")
    b.run()
    f = b.first_sched
    hit_full = (len(full) - 1) // BS * BS
    want = {"b-new-user": len(vc.SYSTEM + vc.user(2)) - S,
            "b-same": len(full) - hit_full,
            "b-salt-same": len(full) - hit_full,
            "b-salt-other": len(full),
            "b-lora-same": len(full) - hit_full,
            "b-lora-other": len(full)}
    # Requests scheduled in one step see no local cache of each other: B's
    # own prefix cache holds nothing before this first step.
    bad = {k: (f.get(k), v) for k, v in want.items() if f.get(k) != v}
    assert not bad, f"first scheduled tokens (got, want): {bad}"
    assert b.stats.get("loaded_blocks", 0) >= 4, b.stats
    assert b.load_errors == 0
    assert b.held() == 0, "scheduler side still holds references"
    assert vc.kvctl_refs(kvctl, admin, os.getpid()) == 0, "the daemon counts references"
    vc.out(first=f, stats=b.stats)
    b.close()


def role_c(sock, admin):
    """Preemption and abort with external hits: every reference released."""
    kvctl = os.environ["KVCTL_BIN"]
    c = vc.Instance(sock, layout="LBNHC", num_blocks=14)
    c.add("c-1", vc.SYSTEM + vc.user(5, 30), max_tokens=40)
    c.add("c-2", vc.SYSTEM + vc.user(6, 30), max_tokens=40)
    c.add("c-3", vc.SYSTEM + vc.user(7, 30), max_tokens=40)
    c.step()                                   # c-1.. load A's prefix
    c.abort("c-3")
    c.run()
    assert c.preempted, "nothing was preempted (the test's cache is too big)"
    assert c.stats.get("loaded_blocks", 0) >= 4, c.stats
    # A request aborted while it waits (its lookup answered, nothing loaded).
    c.add("c-4", vc.SYSTEM + vc.user(8), max_tokens=2)
    c.abort("c-4")
    c.add("c-5", vc.SYSTEM + vc.user(9), max_tokens=2)
    c.run()
    assert c.held() == 0, "scheduler side still holds references"
    refs = vc.kvctl_refs(kvctl, admin, os.getpid())
    assert refs == 0, f"the daemon counts {refs} references of this process"
    vc.out(preempted=sorted(c.preempted), stats=c.stats)
    c.close()


def role_roles(sock, admin):
    """kv_role: a producer saves and never loads, a consumer loads and never
    saves."""
    prod = vc.Instance(sock, kv_role="kv_producer")
    full = vc.SYSTEM + vc.user(60)
    prod.add("p-1", full)
    prod.run()
    assert prod.stats.get("saved_blocks", 0) == (len(full) + 3) // BS, prod.stats
    prod.close()
    prod2 = vc.Instance(sock, kv_role="kv_producer")
    prod2.add("p-2", full)
    prod2.run()
    assert prod2.first_sched["p-2"] == len(full), prod2.first_sched   # no load
    prod2.close()
    cons = vc.Instance(sock, kv_role="kv_consumer")
    cons.add("c-1", full)
    cons.add("c-2", vc.user(61, 50))
    cons.run()
    hit = (len(full) - 1) // BS * BS
    assert cons.first_sched["c-1"] == len(full) - hit, cons.first_sched
    assert cons.stats.get("saved_blocks", 0) == 0, cons.stats
    vc.out(first=cons.first_sched)
    cons.close()


def role_kill(sock, admin, tag):
    """Runs requests, stops half-way until the test says go (the daemon is
    then dead), runs more: all finish, computed locally. Instance y runs
    under vLLM's default kv_load_failure_policy, "fail" (and the connector
    warns of it at start), x under "recompute"."""
    import logging
    policy = "fail" if tag == "y" else "recompute"    # vLLM's default, and ours
    warned = []

    class H(logging.Handler):
        def emit(self, r):
            if r.levelno == logging.WARNING and "kv_load_failure_policy" in r.getMessage():
                warned.append(r.getMessage())
    logging.getLogger("kvcache.vllm").addHandler(H())
    x = vc.Instance(sock, layout="LBNHC", extra={"lookup_deadline_ms": 2000}, policy=policy)
    assert len(warned) == (1 if policy == "fail" else 0), (policy, warned)
    for i in range(2):
        x.add(f"{tag}-pre-{i}", vc.SYSTEM + vc.user(20 + i))
    x.run()
    print("HALF", flush=True)
    sys.stdin.readline()
    for i in range(3):
        x.add(f"{tag}-post-{i}", vc.SYSTEM + vc.user(30 + i), max_tokens=3)
    x.run()
    done = {r for r in x.finished if "-post-" in r}
    assert len(done) == 3, x.finished
    assert x.held() == 0
    vc.out(first=x.first_sched, stats=x.stats)
    x.close()


def role_fill(sock, admin):
    """Computes and saves one request (then the test demotes its blocks)."""
    f = vc.Instance(sock, layout="LBNHC")
    f.add("f-first", vc.SYSTEM + vc.user(40))
    f.run()
    assert f.stats.get("saved_blocks", 0) >= 6, f.stats
    vc.out(stats=f.stats)
    f.close()


def role_promo(sock, admin, pid):
    """The first request's prefix is in the host tier: the lookup waits on a
    promotion; with lookup_timeout_ms 0 the scheduler is answered "ask
    again" (None) rather than held, and the request is scheduled when the
    answer is there, beyond the promoted prefix. The daemon (pid) is
    stopped for the first step, so that the lookup cannot have finished
    before the scheduler asks, however the machine schedules threads."""
    import signal
    kvctl = os.environ["KVCTL_BIN"]
    p = vc.Instance(sock, layout="LBNHC", extra={"lookup_timeout_ms": 0,
                                                 "lookup_deadline_ms": 600000})
    full = vc.SYSTEM + vc.user(40)
    os.kill(int(pid), signal.SIGSTOP)
    try:
        p.add("p-1", full)
        so = p.step()
        assert so.total_num_scheduled_tokens == 0, "scheduled with the daemon stopped"
        assert p.conn.deferred >= 1, "the scheduler was held, not answered None"
    finally:
        os.kill(int(pid), signal.SIGCONT)
    p.run()
    want = len(full) - (len(full) - 1) // BS * BS
    assert p.first_sched.get("p-1") == want, (p.first_sched, want)
    assert p.stats.get("loaded_blocks", 0) == (len(full) - 1) // BS, p.stats
    assert p.held() == 0
    assert vc.kvctl_refs(kvctl, admin, os.getpid()) == 0
    vc.out(first=p.first_sched, stats=p.stats)
    p.close()


def a_events(rep, daemon):
    """A's saves, as kvcached's events say them (replayed, decoded by vLLM's
    own KVEventBatch): each request's LoRA and extra keys as vLLM's block
    pool would publish them (docs/events.md)."""
    import kvt
    import msgspec
    import zmq
    from vllm.distributed.kv_events import BlockStored, KVEventBatch
    dec = msgspec.msgpack.Decoder(KVEventBatch)
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.RCVTIMEO, 20000)
    s.connect(rep)
    s.send_multipart([b"", (0).to_bytes(8, "big")])
    stored = []
    while True:
        fr = s.recv_multipart()
        if fr[1] == b"":
            break
        stored += [e for e in dec.decode(fr[3]).events if isinstance(e, BlockStored)]
    s.close(linger=0)
    ctx.term()
    kind = {"lora": 0, "salt": 0, "plain": 0}
    for e in stored:
        keys = e.extra_keys
        kvt.check(keys is not None and len(keys) == len(e.block_hashes),
                  "a save's BlockStored without one extra_keys entry a block: %r" % (keys,))
        if e.lora_name is not None:
            kvt.check(e.lora_name == "adapter-1" and isinstance(e.lora_id, int) and
                      e.lora_id >= 1 and all(k == ("adapter-1",) for k in keys),
                      "the LoRA request's events: %r %r %r" % (e.lora_name, e.lora_id, keys))
            kind["lora"] += 1
        elif e.parent_block_hash is None and keys[0] == ("tenant-1",):
            kvt.check(all(k is None for k in keys[1:]), "the salt past block 0: %r" % (keys,))
            kind["salt"] += 1
        else:
            kvt.check(e.lora_id is None and all(k is None for k in keys),
                      "a plain request's events: %r %r" % (e.lora_id, keys))
            kind["plain"] += 1
    kvt.check(all(kind.values()), "events of A's saves: %s" % kind, daemon.log)
    print("A's saves in the events: %s" % kind)


def main():
    import kvt
    kvt.need_bins()
    d = kvt.tmpdir()
    rep = "ipc://" + os.path.join(d, "rp.sock")
    base = ("--pool-size", "8MiB", "--segment-size", "4MiB", "--page-size", "64KiB")
    daemon = kvt.Daemon(d, *base, "--events-endpoint", "ipc://" + os.path.join(d, "ev.sock"),
                        "--events-replay-endpoint", rep, "--events-buffer", "100000",
                        "--events-token-ids", "yes", wait=False)
    kvt.check(kvt.wait_for(lambda: kvt.can_connect(daemon.admin) or
                           daemon.proc.poll() is not None), "daemon did not start", daemon.log)
    if daemon.proc.poll() is not None:
        kvt.check("built without KV events" in daemon.logtext(), "daemon exited", daemon.log)
        daemon = kvt.Daemon(d, *base, log="log2")
        rep = None
    cur = [daemon]

    def run(role, *rest):
        return vc.run_child(__file__, [role, cur[0].sock, cur[0].admin, *rest], cur[0].log)

    run("a")
    if rep:
        a_events(rep, daemon)
    run("b")
    run("c")
    run("roles")

    # A prefix in the host tier (G2): promoted while the scheduler goes on.
    d2 = kvt.tmpdir()
    small = kvt.Daemon(d2, "--pool-size", "1MiB", "--segment-size", "1MiB", "--page-size",
                       "64KiB", "--host-tier-size", "4MiB")
    cur[0] = small
    run("fill")
    r = small.kvctl("evict", "--all")          # every cached device block to the host tier
    kvt.check(r.returncode == 0, "kvctl evict: " + r.stderr, small.log)
    print("kvctl evict --all:", r.stdout.strip())
    run("promo", str(small.proc.pid))
    r = small.kvctl("-o", "json", "status")
    kvt.check(r.returncode == 0 and '"promotions": 6' in r.stdout, "kvctl status", small.log)
    small.kill()
    cur[0] = daemon

    # The daemon killed while two instances run.
    procs = [vc.start_child(__file__, ["kill", daemon.sock, daemon.admin, t])
             for t in ("x", "y")]
    for p in procs:
        line = ""
        while line.strip() != "HALF":
            line = p.readline()
            if not line:
                sys.stderr.write(p.finish(60)[2][-8000:])
                kvt.fail("an instance died before the daemon was killed", daemon.log)
    daemon.kill()
    for p in procs:
        p.send("go\n")
    for p in procs:
        rc, o, e = p.finish(600)
        if rc != 0:
            sys.stderr.write(o[-4000:] + e[-8000:])
            kvt.fail("an instance failed after the daemon died")
        res = [ln for ln in o.splitlines() if ln.startswith("RESULT ")]
        print("instance after kill:", res[-1][7:] if res else "?")
    kvt.cleanup()
    print("PASS")


if __name__ == "__main__":
    vc.main_or_child(main, {"a": role_a, "b": role_b, "c": role_c, "kill": role_kill,
                            "fill": role_fill, "promo": role_promo, "roles": role_roles})
