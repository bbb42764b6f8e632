#!/usr/bin/env python3
"""kvcache.sglang under SGLang 0.5.23's own cache controller
(HybridCacheController, sglang/srt/mem_cache/hybrid_cache), as an SGLang
scheduler drives it, on the CPU: the controller attaches the backend through
StorageBackendFactory from the ``dynamic`` configuration (``interface_v1``),
its backup thread writes a request's pages (write_storage ->
batch_set_v1), and in another process another controller's prefetch thread
finds them (batch_exists over SGLang's own page hashes,
get_storage_hash_str) and its I/O thread loads them into its host pool
(batch_get_v1), byte for byte; a prompt of another model finds nothing;
detach closes the sessions and nothing stays referenced. This test plays
the scheduler thread's part (allocating the host pages and handing the hit
to the I/O thread, as unified_radix_cache.py does).

Runs under the SGLang virtual environment (scripts/sglang-env); exits 77
without it."""
import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_env  # noqa: E402

if __name__ == "__main__":
    sglang_env.reexec()

import sglang_storage_common as sc  # noqa: E402

NPAGES = 8
TOKENS = [(17 * i + 5) % 1000 for i in range(NPAGES * sc.PAGE)]
WAIT = 120


def dist():
    """One rank, as SGLang's scheduler process of a TP-1 server: a gloo
    group of one and the parallel widths its launcher would publish."""
    import torch.distributed as td
    from sglang.srt.runtime_context import get_parallel
    get_parallel().override_permanently(
        tp_size=1, tp_rank=0, attn_tp_size=1, attn_tp_rank=0, attn_dp_size=1,
        attn_dp_rank=0, attn_cp_size=1, attn_cp_rank=0, attn_dcp_size=1, attn_dcp_rank=0,
        pp_size=1, pp_rank=0)
    if not td.is_initialized():
        import tempfile
        f = tempfile.mktemp(prefix="kvt-sglang-pg.")
        td.init_process_group("gloo", init_method="file://" + f, rank=0, world_size=1)
    return td.group.WORLD


def controller(kind, layout, model=sc.MODEL, extra=None):
    import torch
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.mem_cache.pool_host.group import HostPoolGroup, PoolEntry
    dev = sc.device_pool(kind)
    hp = sc.host_pool(kind, layout, dev)
    alloc = PagedTokenToKVPoolAllocator(dev.size, sc.PAGE, dev.dtype, "cpu", dev, False)
    group = HostPoolGroup([PoolEntry(name=PoolName.KV, host_pool=hp, device_pool=dev,
                                     layer_mapper=lambda i: i, is_primary_index_anchor=True)])
    ex = sc.dynamic_extra(os.environ["KVT_SOCK"])
    ex.update(extra or {})
    cc = HybridCacheController(alloc, group, sc.PAGE, dist(), threading.Event(),
                               io_backend="direct", storage_backend="dynamic",
                               prefetch_threshold=sc.PAGE, model_name=model,
                               storage_backend_extra_config=ex)
    from kvcache.sglang import KvcachedStorage
    assert type(cc.storage_backend) is KvcachedStorage, type(cc.storage_backend)
    assert cc.page_get_func == cc._page_get_zero_copy, "interface_v1 did not select v1"
    _ = torch
    return cc, hp


def hashes():
    from sglang.srt.mem_cache.utils import get_storage_hash_str
    return get_storage_hash_str(TOKENS, None, page_size=sc.PAGE)


CONFIGS = (("mha", "page_first"), ("mha", "layer_first"), ("mla", "page_first_direct"))


def role_write():
    sc.result({f"{k} {lay}": write(k, lay) for k, lay in CONFIGS})


def role_read(want):
    want = json.loads(want)
    for kind, layout in CONFIGS:
        read(kind, layout, want[f"{kind} {layout}"], sc.MODEL)
        read(kind, layout, None, "kvt/another-model")
        print(f"ok: {kind} {layout}: SGLang's controller backed up {NPAGES} pages through "
              "kvcached; another's prefetch found and loaded them byte-exact; another "
              "model's found none", flush=True)
    sc.result("ok")


def write(kind, layout):
    cc, hp = controller(kind, layout)
    n = len(TOKENS)
    host = hp.alloc(n)
    assert host is not None and host.numel() == n
    sc.fill(hp, sc.seed("controller-" + kind + layout))
    hv = hashes()
    assert len(hv) == NPAGES
    op_id = cc.write_storage(host, TOKENS, hash_value=hv)
    op = cc.ack_backup_queue.get(timeout=WAIT)
    assert op.id == op_id, (op.id, op_id)
    assert op.completed_tokens == n, f"backup wrote {op.completed_tokens} of {n} tokens"
    b = cc.storage_backend
    assert b.counters["set_stored_pages"] == NPAGES, b.counters
    pages = [int(host[i * sc.PAGE]) // sc.PAGE for i in range(NPAGES)]
    want = [sc.page_digest(hp, p) for p in pages]
    cc.detach_storage_backend()
    assert sc.refs() == 0
    assert not [c for c in sc.clients() if c.get("pid") == os.getpid()], \
        "sessions left open after detach"
    return want


def read(kind, layout, want, model):
    cc, hp = controller(kind, layout, model=model)
    # Another instance's scheduler: its own prefix is empty, the prompt
    # goes to the prefetch thread.
    sys.stdout.flush()
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
    op = cc.prefetch(CacheRequestHandle("req-1", 0), TOKENS)
    hit = cc.prefetch_hit_queue.get(timeout=WAIT)
    assert hit is op
    if want is None:
        assert op.storage_hit_count == 0, f"another model found {op.storage_hit_count} tokens"
        cc.detach_storage_backend()
        assert sc.refs() == 0
        return
    assert op.storage_hit_count == len(TOKENS), f"hit {op.storage_hit_count} of {len(TOKENS)}"
    # The scheduler thread's part: host pages for the hit, then the I/O thread.
    # Taken from the top of the pool, so the loaded pages are others than
    # the writer's.
    import torch
    junk = hp.alloc(4 * sc.PAGE)
    host = hp.alloc(op.storage_hit_count)
    assert host is not None
    op.host_indices = host
    op.hash_value = op.hash_value[: op.storage_hit_count // sc.PAGE]
    cc.prefetch_buffer.put(op)
    done = False
    while not done:
        ack = cc.ack_prefetch_queue.get(timeout=WAIT)
        if ack.completed_tokens is not None:
            op.completed_tokens = max(op.completed_tokens, ack.completed_tokens)
        done = ack.completed_req
    assert op.completed_tokens == len(TOKENS), f"loaded {op.completed_tokens}"
    pages = [int(host[i * sc.PAGE]) // sc.PAGE for i in range(NPAGES)]
    got = [sc.page_digest(hp, p) for p in pages]
    assert got == want, "pages loaded by the prefetch differ from the writer's"
    st = cc.storage_backend.get_stats()
    assert sum(st.prefetch_pgs) == NPAGES, st
    cc.detach_storage_backend()
    assert sc.refs() == 0
    _ = (junk, torch)


if __name__ == "__main__":
    sc.write_then_read(__file__, {"write": role_write, "read": role_read})
