#!/usr/bin/env python3
"""KvcachedConnector's save plan with vLLM 0.33's real Scheduler against a
real kvcached (issue 34 item 5, the scheduler's cost): the plan reuses the
lookup's keys and vLLM's block ids from the scheduler output rather than
computing them again, and must still say exactly what vLLM's own state
says. Every Save of every step is checked against vLLM's request and
cache manager (hashes, parent, block ids, token ids, contiguous from block
0), across the cases the shortcuts split: a prompt of whole blocks (the
last token's block is past the lookup's keys), decode blocks (a request
no longer new to the step), a new and a running request in one step. A
second engine then loads every saved block and reads back the bytes the
first wrote.

Runs under the vLLM virtual environment (scripts/vllm-env); exits 77
without it. Exit 0 pass, 1 fail, 77 skip."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_connector_common as vc  # noqa: E402

BS = vc.BS
P1 = vc.SYSTEM + vc.user(51, n=2 * BS)          # 96 tokens: 6 whole blocks
P2 = [900 - t for t in vc.SYSTEM] + vc.user(52, n=2 * BS)
GEN = 40                                        # decode crosses two block boundaries


def checked(inst):
    """Wraps inst's scheduler side so that every Save it plans is compared
    with vLLM's own state at that moment."""
    import kvcache
    sched = inst.conn.connector_scheduler
    orig = sched.build_connector_meta
    upto = {}
    seen = {"saves": 0, "blocks": 0}

    def build(so, kvm):
        meta = orig(so, kvm)
        for s in meta.saves:
            r = inst.reqs[s.req_id]
            ids = inst.sched.kv_cache_manager.get_block_ids(s.req_id)[0]
            n = len(s.block_ids)
            assert n > 0 and s.block_ids[0] in ids, (s.req_id, s.block_ids, ids)
            a = ids.index(s.block_ids[0])
            assert a == upto.get(s.req_id, 0), (s.req_id, a, upto.get(s.req_id))
            assert s.block_ids == list(ids[a:a + n]), (s.req_id, s.block_ids, ids)
            hs = list(r.block_hashes[a:a + n])
            assert len(hs) == n and all(len(h) == kvcache.HASH_BYTES for h in hs)
            assert list(s.hashes) == hs, (s.req_id, a, n, len(s.hashes))
            assert s.parent == (r.block_hashes[a - 1] if a else None), (s.req_id, a)
            assert list(s.token_ids) == list(r.all_token_ids[a * BS:(a + n) * BS])
            assert s.extra_keys == [None] * n, s.extra_keys
            upto[s.req_id] = a + n
            seen["saves"] += 1
            seen["blocks"] += n
        return meta

    sched.build_connector_meta = build
    return upto, seen


def main():
    import kvt
    kvt.need_bins()
    d = kvt.tmpdir()
    daemon = kvt.Daemon(d, "--pool-size", "16MiB", "--segment-size", "4MiB", "--page-size",
                        "64KiB")
    a = vc.Instance(daemon.sock, layout="LBNHC")
    upto, seen = checked(a)
    a.add("p1", P1, max_tokens=GEN)
    a.step()                  # p1's prefill: it is new to this step
    a.step()
    a.add("p2", P2, max_tokens=GEN)
    a.run()                   # p2 new while p1 decodes, then both decode
    assert a.finished >= {"p1", "p2"}, a.finished
    want = {rid: (len(P) + GEN - 1) // BS for rid, P in (("p1", P1), ("p2", P2))}
    kvt.check(upto == want, f"blocks planned for saving {upto}, want {want}", daemon.log)
    full = {rid: list(a.reqs[rid].all_token_ids) for rid in ("p1", "p2")}
    a.close()
    print(f"engine A: {seen['saves']} saves, {seen['blocks']} blocks, each as vLLM says")

    b = vc.Instance(daemon.sock, layout="BLNHC")
    for rid, toks in full.items():
        b.add("b-" + rid, toks, max_tokens=1)
    b.run()                   # reads every loaded token's bytes (vc.Instance.step)
    for rid, toks in full.items():
        n = b.first_sched.get("b-" + rid)
        kvt.check(n == len(toks) - want[rid] * BS,
                  f"b-{rid}: scheduled {n} tokens first, want {len(toks) - want[rid] * BS} "
                  f"(all {want[rid]} blocks from kvcached)", daemon.log)
    kvt.check(b.load_errors == 0, f"{b.load_errors} load errors", daemon.log)
    kvt.check(b.stats.get("loaded_blocks", 0) == sum(want.values()), str(b.stats), daemon.log)
    b.close()
    print(f"engine B: loaded {b.stats.get('loaded_blocks')} blocks, bytes as A wrote them")
    daemon.kill()
    print("PASS")
    kvt.cleanup()
    sys.exit(0)


if __name__ == "__main__":
    vc.need_vllm()
    try:
        main()
    except AssertionError:
        # A check inside the engines: fail through kvt, which stops the
        # daemon (an uncaught exception would leave it running).
        import traceback

        import kvt
        traceback.print_exc()
        kvt.fail("a planned save differs from vLLM's own state (above)")
