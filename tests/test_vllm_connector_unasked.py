#!/usr/bin/env python3
"""KvcachedConnector's batched lookups with vLLM 0.33's real Scheduler
against a real kvcached (issue 34 item 5): the scheduler side looks a
request up with the batch of the first one vLLM asks about, before vLLM
asks about it. A request whose blocks vLLM's own prefix cache then has
(get_num_new_matched_tokens never needs the answer) may be allocated while
its batch's answer is still on the way: the references that lookup takes
in kvcached must be released when it answers, not kept for as long as the
engine's connection lives.

The batch is held back by occupying the scheduler side's lookup thread;
vLLM's scheduler defers the first request (the "ask again" answer) and
schedules the second from its own cache. Once the lookup thread runs
again, kvcached must hold nothing for this engine.

Runs under the vLLM virtual environment (scripts/vllm-env); exits 77
without it. Exit 0 pass, 1 fail, 77 skip."""
import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_connector_common as vc  # noqa: E402

BS = vc.BS
P = vc.SYSTEM + vc.user(61, n=2 * BS)          # 96 tokens: 6 whole blocks
Q = [900 - t for t in vc.SYSTEM] + vc.user(62, n=2 * BS)


def held(daemon):
    """Blocks kvcached holds references on (writable or sealed and held)."""
    import kvt
    r = daemon.kvctl("-o", "json", "pools")
    kvt.check(r.returncode == 0, "kvctl pools: %s" % r.stderr, daemon.log)
    return sum(p["blocks_writable"] + p["blocks_sealed"] for p in json.loads(r.stdout)["pools"])


def main():
    import kvt
    kvt.need_bins()
    d = kvt.tmpdir()
    daemon = kvt.Daemon(d, "--pool-size", "16MiB", "--segment-size", "4MiB", "--page-size",
                        "64KiB")
    a = vc.Instance(daemon.sock)
    a.add("a", P, max_tokens=1)
    a.run()
    a.close()
    kvt.check(kvt.wait_for(lambda: held(daemon) == 0, timeout=30),
              "engine A's references outlive it", daemon.log)

    # Engine B: P in vLLM's own prefix cache (loaded from kvcached once).
    b = vc.Instance(daemon.sock, extra={"lookup_timeout_ms": 20, "lookup_deadline_ms": 60000})
    sched = b.conn.connector_scheduler
    b.add("b0", P, max_tokens=1)
    b.run()
    sched.drain()
    kvt.check(held(daemon) == 0, "b0's lookup references outlive it", daemon.log)

    gate = threading.Event()
    sched._ops.submit(gate.wait, 120)        # the lookup thread, busy
    try:
        b.add("b1", Q, max_tokens=1)         # asked first: its batch holds b2 too
        b.add("b2", P, max_tokens=1)         # all but its last block in vLLM's cache
        b.step()
        kvt.check(sched.deferred >= 1, "b1 was not deferred: the batch was not held back",
                  daemon.log)
        want = len(P) - (len(P) - 1) // BS * BS
        kvt.check(b.first_sched.get("b2") == want,
                  f"b2 scheduled {b.first_sched.get('b2')} tokens first, want {want} (its "
                  "blocks from vLLM's own cache)", daemon.log)
        kvt.check("b1" not in b.first_sched, "b1 scheduled while its lookup was held back",
                  daemon.log)
    finally:
        gate.set()
    b.run()
    kvt.check(b.finished >= {"b0", "b1", "b2"}, f"finished {b.finished}", daemon.log)
    sched.drain()
    n = held(daemon)
    kvt.check(n == 0, f"kvcached holds {n} blocks for engine B's lookups (b2's batched lookup "
              "answered after vLLM allocated b2, and was never released)", daemon.log)
    kvt.check(sched.held_references() == 0,
              f"the scheduler side holds {sched.held_references()} references", daemon.log)
    b.close()
    daemon.kill()
    print("PASS")
    kvt.cleanup()
    sys.exit(0)


if __name__ == "__main__":
    vc.need_vllm()
    main()
