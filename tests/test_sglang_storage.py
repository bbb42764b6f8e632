#!/usr/bin/env python3
"""kvcache.sglang, SGLang's HiCache storage backend on kvcached
(docs/sglang.md), with SGLang 0.5.23's own code and a real daemon:

- the backend is made by SGLang's StorageBackendFactory from the ``dynamic``
  configuration and given SGLang's own host pool (MHA and MLA, in
  layer_first, page_first and page_first_direct, on the CPU);
- one process (an SGLang instance) sets pages from its host pool, another
  finds them (batch_exists) and loads them into other pages of its own host
  pool, byte for byte as the writer held them: with the v1 calls (zero-copy
  against get_page_buffer_meta) and with the older batch_set/batch_get;
- a chain partly in kvcached loads exactly its cached head;
- another model, tenant (namespace), TP rank or layout finds none;
- kvctl shows the sessions by name, and nothing stays referenced.

Runs under the SGLang virtual environment (scripts/sglang-env); exits 77
without it."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_env  # noqa: E402

if __name__ == "__main__":
    sglang_env.reexec()

import sglang_storage_common as sc  # noqa: E402

N = 6                       # pages a writer sets
WRITE = list(range(1, N + 1))
READ = [40, 33, 50, 41, 47, 60]   # pages a reader loads into (any order)


CASES = [(kind, layout, v1) for kind in sc.KINDS for layout in sc.LAYOUTS
         for v1 in (True, False)]


def tag_of(kind, layout, v1):
    return f"{kind}-{layout}-{'v1' if v1 else 'flat'}"


def set_pages(kind, layout, tag, extra):
    """A writer: its host pool from seed ``tag``, N pages set; the pages'
    digests."""
    v1 = extra.pop("v1", True)
    hp = sc.host_pool(kind, layout)
    sc.fill(hp, sc.seed(tag))
    b = sc.backend(kind, layout, hp, sc.dynamic_extra(os.environ["KVT_SOCK"], v1=v1, **extra))
    from kvcache.sglang import KvcachedStorage
    assert type(b) is KvcachedStorage, type(b)
    ks = sc.keys(tag, N)
    assert b.batch_exists(ks) == 0, "pages found before they were set"

    def store():
        if v1:
            return b.batch_set_v1(ks, sc.indices(WRITE))
        return [b.batch_set(ks, [hp.get_data_page(p * sc.PAGE, flat=True) for p in WRITE])]

    ok = store()
    assert all(ok), ok
    assert b.batch_exists(ks) == N
    # Set again: nothing copied, every page reported stored.
    again = store()
    assert all(again), again
    assert b.counters["set_present_pages"] == N, b.counters
    st = b.get_stats()
    assert st.backup_pgs == [N] and len(st.backup_bandwidth) == 1, st
    assert sc.refs() == 0, "references held after set"
    names = [c.get("name", "") for c in sc.clients() if c.get("pid") == os.getpid()]
    assert "sglang-tp0-%d" % os.getpid() in names, names
    b.close()
    return [sc.page_digest(hp, p) for p in WRITE]


def role_write():
    want = {}
    for kind, layout, v1 in CASES:
        want[tag_of(kind, layout, v1)] = set_pages(kind, layout, tag_of(kind, layout, v1),
                                                   {"v1": v1})
    want["tenant"] = set_pages("mha", "page_first", "tenant", {"namespace": "kvt-tenant-a"})
    sc.result(want)


def get_pages(kind, layout, tag, want, extra):
    """A reader: an empty host pool, the writer's pages loaded into others;
    want None: none of them may be found."""
    extra = dict(extra)
    v1 = extra.pop("v1", True)
    hp = sc.host_pool(kind, layout)
    model = extra.pop("model_name", sc.MODEL)
    tp = tuple(extra.pop("tp", (0, 1)))
    b = sc.backend(kind, layout, hp, sc.dynamic_extra(os.environ["KVT_SOCK"], v1=v1, **extra),
                   tp=tp, model=model)
    ks = sc.keys(tag, N)
    hit = b.batch_exists(ks)

    def load(keys, pages):
        if v1:
            return b.batch_get_v1(keys, sc.indices(pages))
        got = b.batch_get(keys, [hp.get_dummy_flat_data_page() for _ in keys])
        for p, t in zip(pages, got):
            if t is not None:
                hp.set_from_flat_data_page(p * sc.PAGE, t)
        return [t is not None for t in got]

    if want is None:
        # Another model, tenant, shard or layout: none of the pages.
        got = load(ks, READ)
        assert hit == 0 and not any(got), (tag, extra, hit, got)
        assert sc.refs() == 0
        b.close()
        return
    assert hit == N, f"{tag}: batch_exists found {hit} of {N}"
    ok = load(ks, READ)
    assert ok == [True] * N, (tag, ok)
    got = [sc.page_digest(hp, p) for p in READ]
    for i in range(N):
        assert got[i] == want[i], f"{tag}: page {i} differs after the round trip"
    # A chain only partly in kvcached: its head loads, the rest are misses.
    part = ks[:3] + sc.keys(tag + "-absent", 2)
    assert b.batch_exists(part) == 3
    ok = load(part, [20, 21, 22, 23, 24])
    assert ok == [True, True, True, False, False], (tag, ok)
    st = b.get_stats()
    assert sum(st.prefetch_pgs) == N + 3, st
    assert sc.refs() == 0, "references held after get"
    b.close()


def role_read(want):
    want = json.loads(want)
    for kind, layout, v1 in CASES:
        tag = tag_of(kind, layout, v1)
        # Another process, same model/tenant/layout/shard: every page.
        get_pages(kind, layout, tag, want[tag], {"v1": v1})
        print(f"ok: {kind} {layout} {'v1' if v1 else 'batch_get/batch_set'}: {N} pages set "
              "by one process, loaded byte-exact by another", flush=True)
        if not v1:
            continue
        # Instances whose bytes would differ never share.
        others = [{"model_name": "kvt/another-model"}, {"model": "kvt/another-model"},
                  {"namespace": "kvt-other-tenant"}, {"v1": False}]
        if kind == "mha":
            others.append({"tp": [1, 2]})
        for o in others:
            get_pages(kind, layout, tag, None, o)
        for lay in sc.LAYOUTS:
            if lay != layout:
                get_pages(kind, lay, tag, None, {})
        print(f"ok: {kind} {layout}: another model, tenant, shard, layout or page format "
              "finds none", flush=True)
    get_pages("mha", "page_first", "tenant", want["tenant"], {"namespace": "kvt-tenant-a"})
    get_pages("mha", "page_first", "tenant", None, {"namespace": "kvt-tenant-b"})
    get_pages("mha", "page_first", "tenant", None, {})
    print("ok: namespaces: a tenant's pages, not another's", flush=True)
    sc.result("ok")


def role_get(kind, layout, tag, want, extra):
    """One reader (for test_sglang_storage_restart.py)."""
    get_pages(kind, layout, tag, json.loads(want), json.loads(extra))
    sc.result("ok")


if __name__ == "__main__":
    sc.write_then_read(__file__, {"write": role_write, "read": role_read, "get": role_get})
