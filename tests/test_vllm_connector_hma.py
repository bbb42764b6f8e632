#!/usr/bin/env python3
"""KvcachedConnector with vLLM's hybrid memory allocator (SupportsHMA,
docs/vllm.md "Hybrid models"), on vLLM 0.33's real Scheduler against a real
kvcached: a Gemma-2-like model (sliding-window and full-attention layers,
grouped by vLLM's own planner into two KV cache groups over the same
memory) in two engines (two processes).

- a: the connector keeps vLLM's hybrid allocator (vLLM's own checks), runs
  requests and saves each group's blocks into that group's pool;
- b: another engine loads a's prefixes: the hit covers every group, each
  group's blocks land in that group's layers (the fake model checks every
  byte attention reads, per layer), a sliding-window group loads only the
  blocks its window reaches (vLLM holds the null block for the others);
- planted: blocks sealed into one group's pool only, or a window with its
  first block missing: no hit offered where a group cannot supply what
  vLLM holds; the window alone is enough;
- other: an engine whose groups differ (another window; layers grouped
  otherwise) registers none of a's pools and gets no hit;
- refused: configurations the connector cannot keep right (chunked local
  attention, Mamba state, groups of different block sizes) refuse at
  construction with a message naming them;
- fail: a load missing one group's block fails the request's load as a
  whole (failed_recving), vLLM recomputes it (bytes checked) and is not
  offered the same hit again.

Runs under the vLLM virtual environment (scripts/vllm-env); exits 77
without it. Exit 0 pass, 1 fail, 77 skip."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_connector_common as vc  # noqa: E402

BS = vc.BS
W = 40                                    # the sliding window: 3 blocks reach back
GEMMA = [W, None, W, None]                # layers 0, 2 sliding; 1, 3 full
LONG = [100 + (i * 17) % 800 for i in range(10 * BS)]   # 10 blocks of system prompt


def pools_of(inst):
    return [sp.desc(sp.order)[0] for sp in inst.conn.specs]


def window_blocks(n):
    """Blocks a sliding-window group holds after a hit of n blocks from 0."""
    return n - max(0, n * BS - W + 1) // BS


def check_hma(inst):
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
    ktc = inst.conn._vllm_config.kv_transfer_config
    assert KVConnectorFactory.supports_hma_config(ktc), "vLLM would turn its hybrid allocator off"
    assert supports_hma(inst.conn) and supports_hma(inst.worker)
    kinds = sorted(type(g.kv_cache_spec).__name__ for g in inst.kvc.kv_cache_groups)
    assert kinds == sorted([FullAttentionSpec.__name__, SlidingWindowSpec.__name__]), kinds
    coord = type(inst.sched.kv_cache_manager.coordinator).__name__
    assert "Hybrid" in coord, coord
    assert len(set(pools_of(inst))) == 2, pools_of(inst)


def role_a(sock, admin):
    a = vc.Instance(sock, windows=GEMMA, num_blocks=400)
    check_hma(a)
    a.add("a-long", LONG + vc.user(1))
    a.add("a-sys", vc.SYSTEM + vc.user(2))
    a.run()
    # Every group saved each full block: 12 (a-long: 200 tokens and 3
    # computed outputs) + 6 (a-sys: 104 + 3), the sliding-window group too
    # (its blocks are all held while the step that computes them runs).
    assert a.stats.get("saved_blocks", 0) == 2 * (12 + 6), a.stats
    assert a.held() == 0
    vc.out(pools=pools_of(a), stats=a.stats)
    a.close()


def role_b(sock, admin):
    kvctl = os.environ["KVCTL_BIN"]
    b = vc.Instance(sock, windows=GEMMA, num_blocks=400, batched=1024)
    check_hma(b)
    full = LONG + vc.user(1)
    b.add("b-same", full)                         # a's whole prompt
    b.add("b-prefix", LONG + vc.user(7))          # a's 10-block system prompt
    b.run()
    f = b.first_sched
    n_same = (len(full) - 1) // BS
    want = {"b-same": len(full) - n_same * BS, "b-prefix": len(LONG + vc.user(7)) - len(LONG)}
    assert {k: f[k] for k in want} == want, (f, want)
    # A full-attention group loads every hit block, a sliding-window one the
    # blocks its window reaches (the others are vLLM's null block).
    loaded = n_same + window_blocks(n_same) + 10 + window_blocks(10)
    assert b.stats.get("loaded_blocks") == loaded, (b.stats, loaded)
    assert b.failed_loads == 0 and b.load_errors == 0
    assert b.held() == 0, "scheduler side still holds references"
    refs = vc.kvctl_refs(kvctl, admin, os.getpid())
    assert refs == 0, f"the daemon counts {refs} references of this process"
    vc.out(first=f, stats=b.stats, pools=pools_of(b))
    b.close()


def role_fail(sock, admin):
    """A hybrid load that misses a block of one group fails the request's
    load as a whole (failed_recving; vLLM 0.33 takes no per-block errors
    from several groups): vLLM recomputes it, every byte checked, and the
    connector does not offer the same hit again (it would fail the same
    way for ever)."""
    kvctl = os.environ["KVCTL_BIN"]
    b = vc.Instance(sock, windows=GEMMA, num_blocks=400, batched=1024)
    wk = b.worker.connector_worker
    swa_g = [i for i, (_, w) in enumerate(b.groups) if w is not None][0]
    real_lookup = wk._lookup_for_load

    def lookup(ld, hold, group=0):
        if group == swa_g and ld.hashes:       # a window block kvcached lacks
            ld.hashes = [b"\x77" * 32] + list(ld.hashes[1:])
        return real_lookup(ld, hold, group)
    wk._lookup_for_load = lookup
    full = LONG + vc.user(1)
    b.add("f-same", full)
    b.run()
    assert b.failed_loads == 1, b.failed_loads
    assert b.first_sched["f-same"] == len(full), b.first_sched
    assert not b.stats.get("loaded_blocks"), b.stats
    assert b.stats.get("load_errors", 0) > 0, b.stats
    # Recomputed, its blocks are saved again (what kvcached lacked among
    # them): 12 full blocks (200 tokens and 3 outputs) a group.
    assert b.stats.get("saved_blocks") == 2 * 12, b.stats
    assert b.held() == 0
    refs = vc.kvctl_refs(kvctl, admin, os.getpid())
    assert refs == 0, f"the daemon counts {refs} references of this process"
    vc.out(first=b.first_sched, stats=b.stats)
    b.close()


def plant(p, rid, tokens, ranges):
    """Runs tokens' prompt in engine p (saving nothing itself), then seals
    the given block ranges of each group, {group: (a, b)}, with p's own
    bytes through p's worker side: another engine then finds exactly those
    blocks in kvcached."""
    from kvcache.vllm.identity import kv_keys
    from kvcache.vllm.metadata import Save
    r = p.add(rid, tokens, max_tokens=50)
    while r.num_computed_tokens < len(tokens):
        p.step()
    keys = kv_keys(r.block_hashes)
    ids = p.sched.kv_cache_manager.get_block_ids(rid)
    w = p.worker.connector_worker
    for g, (a, b) in ranges.items():
        assert all(x != p.null_id for x in ids[g][a:b]), (g, a, b)
        w._save_group(g, [Save(rid, keys[a:b], keys[a - 1] if a else None, list(ids[g][a:b]),
                               list(r.all_token_ids[a * BS:b * BS]), group=g)])
    p.abort(rid)


def role_planted(sock, admin):
    """Hits offered only where every group has what vLLM will hold."""
    ex = {"save": "none"}
    p = vc.Instance(sock, windows=GEMMA, num_blocks=400, extra=ex)
    full_g = [i for i, (_, w) in enumerate(p.groups) if w is None][0]
    swa_g = 1 - full_g
    prompts = {k: [100 + (i * 29 + 7 * j) % 800 for i in range(8 * BS + 5)]
               for j, k in enumerate(("window", "hole", "fullonly", "swaonly"))}
    n = 8
    first = n - window_blocks(n)
    plant(p, "p-window", prompts["window"], {full_g: (0, n), swa_g: (first, n)})
    plant(p, "p-hole", prompts["hole"], {full_g: (0, n), swa_g: (first + 1, n)})
    plant(p, "p-fullonly", prompts["fullonly"], {full_g: (0, n)})
    plant(p, "p-swaonly", prompts["swaonly"], {swa_g: (0, n)})
    p.run()
    p.close()
    b = vc.Instance(sock, windows=GEMMA, num_blocks=400, batched=1024)
    for k, toks in prompts.items():
        b.add("b-" + k, toks)
    b.run()
    f = b.first_sched
    L = len(prompts["window"])
    want = {"b-window": L - n * BS, "b-hole": L, "b-fullonly": L, "b-swaonly": L}
    assert {k: f[k] for k in want} == want, (f, want)
    assert b.stats.get("loaded_blocks") == n + window_blocks(n), b.stats
    assert b.failed_loads == 0 and b.load_errors == 0
    assert b.held() == 0
    vc.out(first=f, stats=b.stats)
    b.close()


def role_other(sock, admin, a_pools):
    """Engines whose groups differ from a's share nothing with it."""
    a_pools = set(json.loads(a_pools))
    res = {}
    for tag, windows in (("window", [W + 24, None, W + 24, None]),
                         ("grouping", [W, W, None, None])):
        e = vc.Instance(sock, windows=windows, num_blocks=400, batched=1024)
        mine = set(pools_of(e))
        assert not mine & a_pools, (tag, mine, a_pools)
        full = LONG + vc.user(1)
        e.add("o-" + tag, full)
        e.run()
        assert e.first_sched["o-" + tag] == len(full), (tag, e.first_sched)
        assert not e.stats.get("loaded_blocks"), e.stats
        res[tag] = sorted(mine)
        e.close()
    vc.out(**res)


def role_refused(sock, admin):
    """What the connector cannot keep right is refused at construction."""
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec, FullAttentionSpec,
                                            KVCacheConfig, KVCacheGroupSpec, MambaSpec,
                                            SlidingWindowSpec)
    from kvcache.vllm import KvcachedConnector
    base = vc.Instance(sock, windows=GEMMA, num_blocks=400)
    cfg = base.conn._vllm_config
    base.close()
    full = FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=16, dtype=torch.float16)
    cases = {
        "ChunkedLocalAttentionSpec": ChunkedLocalAttentionSpec(
            block_size=BS, num_kv_heads=2, head_size=16, dtype=torch.float16,
            attention_chunk_size=64),
        "MambaSpec": MambaSpec(block_size=BS, shapes=((16,),), dtypes=(torch.float16,)),
        "block sizes": SlidingWindowSpec(block_size=2 * BS, num_kv_heads=2, head_size=16,
                                         dtype=torch.float16, sliding_window=W),
    }
    said = {}
    for what, other in cases.items():
        kvc = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(["model.layers.0.self_attn.attn"], full),
            KVCacheGroupSpec(["model.layers.1.self_attn.attn"], other)])
        for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
            try:
                KvcachedConnector(cfg, role, kvc)
            except ValueError as e:
                assert what in str(e), (what, str(e))
                said[what] = str(e)
            else:
                raise AssertionError(f"{what}: the connector was constructed")
    vc.out(said=said)


def main():
    import kvt
    kvt.need_bins()
    d = kvt.tmpdir()
    daemon = kvt.Daemon(d, "--pool-size", "16MiB", "--segment-size", "4MiB",
                        "--page-size", "64KiB")

    def run(role, *rest):
        return vc.run_child(__file__, [role, daemon.sock, daemon.admin, *rest], daemon.log)

    a = run("a")
    run("b")
    run("fail")
    run("planted")
    run("other", json.dumps(a["pools"]))
    run("refused")
    kvt.cleanup()
    print("PASS")


if __name__ == "__main__":
    vc.main_or_child(main, {"a": role_a, "b": role_b, "fail": role_fail, "planted": role_planted,
                            "other": role_other, "refused": role_refused})
