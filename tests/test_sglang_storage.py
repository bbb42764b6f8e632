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
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_env  # noqa: E402

if __name__ == "__main__":
    sglang_env.reexec()

import sglang_storage_common as sc  # noqa: E402

N = 6                       # pages a writer sets
WRITE = list(range(1, N + 1))
READ = [40, 33, 50, 41, 47, 60]   # pages a reader loads into (any order)


def result(obj):
    print("RESULT " + json.dumps(obj), flush=True)


def role_set(kind, layout, tag, extra):
    """A writer: its host pool from seed ``tag``, N pages set."""
    extra = json.loads(extra)
    hp = sc.host_pool(kind, layout)
    sc.fill(hp, sc.seed(tag))
    b = sc.backend(kind, layout, hp, sc.dynamic_extra(os.environ["KVT_SOCK"], **extra))
    from kvcache.sglang import KvcachedStorage
    assert type(b) is KvcachedStorage, type(b)
    ks = sc.keys(tag, N)
    assert b.batch_exists(ks) == 0, "pages found before they were set"
    if extra.get("v1", True):
        ok = b.batch_set_v1(ks, sc.indices(WRITE))
        assert ok == [True] * N, ok
    else:
        vals = [hp.get_data_page(p * sc.PAGE, flat=True) for p in WRITE]
        assert b.batch_set(ks, vals) is True
    assert b.batch_exists(ks) == N
    # Set again: nothing copied, every page reported stored.
    again = b.batch_set_v1(ks, sc.indices(WRITE)) if extra.get("v1", True) else \
        [b.batch_set(ks, [hp.get_data_page(p * sc.PAGE, flat=True) for p in WRITE])]
    assert all(again), again
    assert b.counters["set_present_pages"] == N, b.counters
    st = b.get_stats()
    assert sum(st.backup_pgs) == N and st.backup_bandwidth, st
    assert sc.refs() == 0, "references held after set"
    names = [c.get("name", "") for c in sc.clients() if c.get("pid") == os.getpid()]
    assert any(n.startswith("sglang-tp0-%d" % os.getpid()) for n in names), names
    result([sc.page_digest(hp, p) for p in WRITE])
    b.close()


def role_get(kind, layout, tag, want, extra):
    """A reader: an empty host pool, the writer's pages loaded into others."""
    extra = json.loads(extra)
    want = json.loads(want)
    hp = sc.host_pool(kind, layout)
    model = extra.pop("model_name", sc.MODEL)
    tp = tuple(extra.pop("tp", (0, 1)))
    b = sc.backend(kind, layout, hp, sc.dynamic_extra(os.environ["KVT_SOCK"], **extra), tp=tp,
                   model=model)
    ks = sc.keys(tag, N)
    hit = b.batch_exists(ks)
    if want is None:
        # Another model, tenant, shard or layout: none of the pages.
        got = b.batch_get_v1(ks, sc.indices(READ)) if extra.get("v1", True) else \
            b.batch_get(ks, [hp.get_dummy_flat_data_page() for _ in ks])
        assert hit == 0 and not any(got), (hit, got)
        assert sc.refs() == 0
        result("none")
        return
    assert hit == N, f"batch_exists found {hit} of {N}"
    if extra.get("v1", True):
        ok = b.batch_get_v1(ks, sc.indices(READ))
        assert ok == [True] * N, ok
    else:
        pages = b.batch_get(ks, [hp.get_dummy_flat_data_page() for _ in ks])
        assert all(p is not None for p in pages), pages
        for p, t in zip(READ, pages):
            hp.set_from_flat_data_page(p * sc.PAGE, t)
    got = [sc.page_digest(hp, p) for p in READ]
    for i in range(N):
        assert got[i] == want[i], f"{kind} {layout}: page {i} differs after the round trip"
    # A chain only partly in kvcached: its head loads, the rest are misses.
    part = ks[:3] + sc.keys(tag + "-absent", 2)
    assert b.batch_exists(part) == 3
    if extra.get("v1", True):
        ok = b.batch_get_v1(part, sc.indices([70, 71, 72, 73, 74]))
        assert ok == [True, True, True, False, False], ok
    st = b.get_stats()
    assert sum(st.prefetch_pgs) >= N, st
    assert sc.refs() == 0, "references held after get"
    result("ok")
    b.close()


def main():
    import kvt
    kvt.need_bins()
    d = kvt.tmpdir()
    daemon = kvt.Daemon(d, "--pool-size", "16MiB", "--segment-size", "4MiB", "--page-size",
                        "64KiB")
    env = dict(os.environ, KVT_ADMIN=daemon.admin, KVT_SOCK=daemon.sock)

    def run(*args):
        r = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True,
                           text=True, timeout=300, env=env)
        res = [ln[7:] for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
        if r.returncode != 0 or not res:
            sys.stderr.write(r.stdout[-3000:] + r.stderr[-6000:])
            kvt.fail(f"{args[:3]} failed (exit {r.returncode})", daemon.log)
        return json.loads(res[-1])

    no = json.dumps({})
    for kind in sc.KINDS:
        for layout in sc.LAYOUTS:
            for v1 in (True, False):
                tag = f"{kind}-{layout}-{v1}"
                ex = json.dumps({"v1": v1} if not v1 else {})
                want = run("set", kind, layout, tag, ex if not v1 else no)
                assert len(set(want)) == N
                # Another process, same model/tenant/layout/shard: every page.
                check = run("get", kind, layout, tag, json.dumps(want), ex)
                kvt.check(check == "ok", f"{tag}: {check}", daemon.log)
                print(f"ok: {kind} {layout} {'v1' if v1 else 'batch_get/batch_set'}: "
                      f"{N} pages set by one process, loaded byte-exact by another",
                      flush=True)
            # Instances whose bytes would differ never share.
            tag = f"{kind}-{layout}-True"
            others = [{"model_name": "kvt/another-model"}, {"namespace": "kvt-other-tenant"},
                      {"model": "kvt/another-model"}]
            if kind == "mha":
                others.append({"tp": [1, 2]})
            for o in others:
                kvt.check(run("get", kind, layout, tag, "null", json.dumps(o)) == "none",
                          f"{tag} {o}", daemon.log)
            other = [lay for lay in sc.LAYOUTS if lay != layout][0]
            kvt.check(run("get", kind, other, tag, "null", no) == "none", f"{tag} as {other}",
                      daemon.log)
            print(f"ok: {kind} {layout}: other model, tenant, shard, layout find none",
                  flush=True)
    # The writer's tenant sets in its own namespace; the other tenant finds none.
    want = run("set", "mha", "page_first", "tenant", json.dumps({"namespace": "kvt-tenant-a"}))
    kvt.check(run("get", "mha", "page_first", "tenant", json.dumps(want),
                  json.dumps({"namespace": "kvt-tenant-a"})) == "ok", "tenant a", daemon.log)
    kvt.check(run("get", "mha", "page_first", "tenant", "null",
                  json.dumps({"namespace": "kvt-tenant-b"})) == "none", "tenant b", daemon.log)
    print("ok: namespaces: one tenant's pages, not another's", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        role, args = sys.argv[2], sys.argv[3:]
        {"set": role_set, "get": role_get}[role](*args)
    else:
        main()
