#!/usr/bin/env python3
"""KvcachedConnector's worker side with real bytes (docs/vllm.md): CPU KV
tensors laid out by vLLM's own create_kv_cache_views in each of vLLM 0.33's
layouts (and with kernel blocks smaller than the manager's), saved into a
real kvcached by one process and loaded into other block ids by another,
byte for byte; a chain that is only partly in kvcached, and a daemon that
is gone, report exactly the blocks that did not load
(get_block_ids_with_load_errors); nothing stays referenced.

Runs under the vLLM virtual environment (scripts/vllm-env); exits 77
without it."""
import hashlib
import json
import logging
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_connector_common as vc  # noqa: E402

NB = 32
LAYOUTS = ["LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC"]


def worker(sock, layout, kernel_bs=None, extra=None):
    import torch
    from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                             SchedulerConfig, VllmConfig)
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                            KVCacheTensor, compute_layout_strides,
                                            create_kv_cache_views)
    from vllm.v1.kv_cache_layout import KVCacheLayout

    from kvcache.vllm import KvcachedConnector

    ex = {"socket": sock, "model": "kvt-worker", "retry_s": 0.05}
    ex.update(extra or {})
    mc = ModelConfig(model=vc.model_dir(), skip_tokenizer_init=True, dtype="float16", seed=0,
                     max_model_len=4096)
    cc = CacheConfig(block_size=vc.BS, cache_dtype="auto", enable_prefix_caching=True)
    cc.kv_cache_layout = layout
    cfg = VllmConfig(model_config=mc, cache_config=cc,
                     scheduler_config=SchedulerConfig(max_model_len=4096,
                                                      is_encoder_decoder=False),
                     kv_transfer_config=KVTransferConfig(
                         kv_connector="KvcachedConnector", kv_role="kv_both",
                         kv_connector_module_path="kvcache.vllm",
                         kv_connector_extra_config=ex),
                     device_config=DeviceConfig("cpu"))
    spec = FullAttentionSpec(block_size=vc.BS, num_kv_heads=vc.HEADS, head_size=vc.HEAD,
                             dtype=torch.float16)
    lay = KVCacheLayout[layout]
    n = len(vc.LAYERS)
    # Strides as vLLM's planner computes them (kv_cache_planning.py).
    ls, bstride = compute_layout_strides(spec, NB, n, lay)[:2]
    t = KVCacheTensor(size=spec.page_size_bytes * NB * n, layers=list(vc.LAYERS),
                      layer_stride=ls, block_stride=bstride)
    kvc = KVCacheConfig(num_blocks=NB, kv_cache_tensors=[t],
                        kv_cache_groups=[KVCacheGroupSpec(list(vc.LAYERS), spec)])
    raw = torch.zeros(t.size, dtype=torch.int8)
    views = create_kv_cache_views(raw, spec, NB, lay, t, kernel_block_size=kernel_bs)
    kv = dict(zip(vc.LAYERS, views))
    w = KvcachedConnector(cfg, KVConnectorRole.WORKER, kvc)
    w.register_kv_caches(kv)
    return w, kv, raw


def fill(kv, bid, seed):
    """Block bid of every layer: distinct bytes from seed for each (head,
    token) in logical [H, N, C] order, whatever the physical layout and the
    kernel split."""
    import torch
    ratio = kv[vc.LAYERS[0]].shape[0] // NB
    for li, name in enumerate(vc.LAYERS):
        v = kv[name].view(torch.uint8)
        h, nk, c = v[bid * ratio].shape
        need = h * nk * ratio * c
        b = (hashlib.sha256(f"{seed}/{li}".encode()).digest() * (need // 32 + 1))[:need]
        b = bytes((x + i) & 0xFF for i, x in enumerate(b))     # no period of 32
        full = torch.frombuffer(bytearray(b), dtype=torch.uint8).view(h, nk * ratio, c)
        for k in range(ratio):
            v[bid * ratio + k].copy_(full[:, k * nk:(k + 1) * nk, :])


def logical(kv, bid):
    """Block bid of every layer in logical [H, N, C] order, whatever the
    kernel split: the kernel blocks' tokens put back side by side."""
    import torch
    ratio = kv[vc.LAYERS[0]].shape[0] // NB
    out = []
    for name in vc.LAYERS:
        v = kv[name].view(torch.uint8)
        out.append(torch.cat([v[bid * ratio + k] for k in range(ratio)], dim=1)
                   .contiguous().numpy().tobytes())
    return b"".join(out)


def hashes(tag, n):
    return [hashlib.sha256(f"{tag}/{i}".encode()).digest() for i in range(n)]


def meta(loads=(), saves=()):
    from kvcache.vllm.connector import KvcachedConnectorMetadata
    return KvcachedConnectorMetadata(loads=list(loads), saves=list(saves))


def do_save(w, m):
    w.bind_connector_metadata(m)
    w.wait_for_save()
    w.clear_connector_metadata()


def do_load(w, m):
    w.bind_connector_metadata(m)
    w.start_load_kv(None)
    err = w.get_block_ids_with_load_errors()
    loaded = w.build_connector_worker_meta()
    w.clear_connector_metadata()
    return err, loaded


def save_one(sock, layout, kbs, tag):
    from kvcache.vllm.connector import _Save
    w, kv, _ = worker(sock, layout, int(kbs) or None)
    ids = [3, 9, 4, 20]
    for i, b in enumerate(ids):
        fill(kv, b, f"{tag}/{i}")
    toks = list(range(len(ids) * vc.BS))
    do_save(w, meta(saves=[_Save("r", hashes(tag, len(ids)), None, ids, toks)]))
    st = w.get_kv_connector_stats()
    assert st and st.data["saved_blocks"] == len(ids), st and st.data
    w.shutdown()
    return [logical(kv, b).hex() for b in ids]


def load_one(sock, layout, kbs, tag, want):
    from kvcache.vllm.connector import _Load
    kvctl = os.environ["KVCTL_BIN"]
    w, kv, _ = worker(sock, layout, int(kbs) or None)
    ids = [30, 0, 7, 12]
    err, loaded = do_load(w, meta(loads=[_Load("r", hashes(tag, 4), ids)]))
    assert not err, f"load errors {err}"
    assert loaded is not None and loaded.loaded == {"r"}
    for i, b in enumerate(ids):
        assert logical(kv, b).hex() == want[i], \
            f"{tag} into {layout} (kernel block {kbs}): block {i} differs after the round trip"
    # Only the first 2 of a chain in kvcached: the other 3 are errors.
    chain = hashes(tag, 2) + hashes(tag + "-absent", 3)
    ids2 = [1, 2, 5, 6, 8]
    err, _ = do_load(w, meta(loads=[_Load("p", chain, ids2)]))
    assert err == {5, 6, 8}, f"load errors {err}, want {{5, 6, 8}}"
    w.shutdown()
    assert vc.kvctl_refs(kvctl, os.environ["KVT_ADMIN"], os.getpid()) == 0


def role_save(sock, pairs):
    """Saves one chain per pair, in the pair's first layout (one worker
    each, all in this process); prints what each block holds."""
    out = {}
    for i, (a, _, ka, _) in enumerate(json.loads(pairs)):
        out[f"t{i}"] = save_one(sock, a, ka, f"t{i}")
    vc.out(**out)


def role_load(sock, pairs, want):
    """Loads every pair's chain into its second layout (another process);
    want: the file of what role_save printed."""
    with open(want) as f:
        want = json.load(f)
    for i, (_, b, _, kb) in enumerate(json.loads(pairs)):
        load_one(sock, b, kb, f"t{i}", want[f"t{i}"])
    vc.out(ok=True)


def role_refused(sock, what):
    """kvcached refuses (a namespace this uid may not open) or is full: the
    save is skipped, the load reports its blocks, nothing raises."""
    import time

    import kvcache
    from kvcache.vllm.connector import _Load, _Save
    rec = LogRecords()
    connects = []
    real_connect = kvcache.connect

    def counting_connect(*a, **kw):     # the real connect, counted
        connects.append(1)
        return real_connect(*a, **kw)
    kvcache.connect = counting_connect
    ns = "not-granted-to-this-uid"
    extra = {"namespace": ns, "retry_s": 0.01} if what == "namespace" else None
    w, kv, _ = worker(sock, "LBNHC", extra=extra)
    do_save(w, meta(saves=[_Save("s", hashes(what, 2), None, [4, 5],
                                 list(range(2 * vc.BS)))]))
    for _ in range(3):
        # Past the retry interval each time: a refusal that were retried
        # would connect again here.
        t = time.monotonic() + 0.02
        while time.monotonic() < t:
            time.sleep(0.005)
        err, _ = do_load(w, meta(loads=[_Load("r", hashes(what, 2), [1, 2])]))
        assert err == {1, 2}, err
    st = w.get_kv_connector_stats()
    assert st.data["save_failures"] == 2 and st.data["saved_blocks"] == 0, st.data
    if what == "namespace":
        errs = rec.at(logging.ERROR)
        assert len(errs) == 1 and f"uid {os.getuid()}" in errs[0] and repr(ns) in errs[0], \
            f"the refusal's ERRORs: {errs}"
        assert len(connects) == 1, f"a refused namespace was tried {len(connects)} times"
    if what == "full":
        assert vc.kvctl_refs(os.environ["KVCTL_BIN"], os.environ["KVT_ADMIN"], os.getpid()) == 0
    vc.out(ok=True)
    w.shutdown()


class LogRecords(logging.Handler):
    """The connector's log records (logger kvcache.vllm) in this process."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []
        lg = logging.getLogger("kvcache.vllm")
        lg.setLevel(logging.DEBUG)
        lg.addHandler(self)

    def emit(self, r):
        self.records.append((r.levelno, r.getMessage()))

    def at(self, level, text=""):
        return [m for lv, m in self.records if lv == level and text in m]


def role_lostback(sock):
    """The daemon killed under a running worker, then started again: one
    WARNING when it is lost (however many calls fail), one INFO when a call
    gets through again; the test's parent kills and restarts it between the
    lines this prints."""
    from kvcache.vllm.connector import _Load, _Save
    rec = LogRecords()
    w, kv, _ = worker(sock, "LBNHC", extra={"retry_s": 0.01})
    do_save(w, meta(saves=[_Save("s", hashes("lb", 2), None, [4, 5],
                                 list(range(2 * vc.BS)))]))
    assert not rec.at(logging.WARNING), rec.records
    print("UP", flush=True)
    sys.stdin.readline()                  # the daemon is dead now
    for i in range(4):
        err, _ = do_load(w, meta(loads=[_Load("r", hashes("lb", 2), [1, 2])]))
        assert err == {1, 2}, err
        do_save(w, meta(saves=[_Save("s", hashes(f"lb{i}", 1), None, [6],
                                     list(range(vc.BS)))]))
    lost = rec.at(logging.WARNING, "lost")
    assert len(lost) == 1, f"WARNINGs for one loss: {rec.at(logging.WARNING)}"
    assert not rec.at(logging.INFO, "back")
    print("LOST", flush=True)
    sys.stdin.readline()                  # a new daemon on the same socket
    # Saves until one gets through: the connector retries no more often
    # than retry_s, and the library's own reconnection backs off after the
    # calls that failed while the daemon was dead, so how many saves that
    # takes is the clock's, not a count (three were not always enough).
    deadline, i = time.monotonic() + 60, 0
    while not rec.at(logging.INFO, "back"):
        assert time.monotonic() < deadline, "no save got through to the new daemon in 60 s"
        do_save(w, meta(saves=[_Save("s", hashes(f"lb-back{i}", 1), None, [7],
                                     list(range(vc.BS)))]))
        i += 1
        time.sleep(0.01)
    for j in range(2):                    # and more saves log nothing more
        do_save(w, meta(saves=[_Save("s", hashes(f"lb-more{j}", 1), None, [7],
                                     list(range(vc.BS)))]))
    back = rec.at(logging.INFO, "back")
    assert len(back) == 1, f"INFOs for one return: {back}"
    assert len(rec.at(logging.WARNING, "lost")) == 1
    st = w.get_kv_connector_stats()
    assert st.data["saved_blocks"] >= 3, st.data
    vc.out(ok=True)
    w.shutdown()


def role_failfwd(sock):
    """vLLM's own step wrapper (KVConnectorModelRunnerMixin
    ._get_kv_connector_output, which calls wait_for_save in a finally) around
    a forward that raises: nothing of that step is sealed, so another engine
    finds nothing; the same step with a forward that returns seals."""
    from vllm.distributed.kv_transfer import kv_transfer_state
    from vllm.forward_context import set_forward_context
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin

    from kvcache.vllm.connector import _Load, _Save
    w, kv, _ = worker(sock, "LBNHC")
    kv_transfer_state._KV_CONNECTOR_AGENT = w
    ids = [3, 4]
    for i, b in enumerate(ids):
        fill(kv, b, f"ff/{i}")

    def step(tag, fail):
        so = SchedulerOutput.make_empty()
        so.kv_connector_metadata = meta(saves=[_Save("r", hashes(tag, 2), None, ids,
                                                     list(range(2 * vc.BS)))])
        try:
            with set_forward_context(None, w._vllm_config), \
                    KVConnectorModelRunnerMixin._get_kv_connector_output(so):
                if fail:
                    raise RuntimeError("the forward failed (planted)")
        except RuntimeError:
            assert fail
        # Another engine (another connection) looks the step's blocks up.
        r, _, _ = worker(sock, "LBNHC")
        err, _ = do_load(r, meta(loads=[_Load("x", hashes(tag, 2), [10, 11])]))
        r.shutdown()
        return err

    err = step("ff-raise", True)
    assert err == {10, 11}, f"blocks of a step whose forward raised were sealed ({err})"
    # An exception being handled around the whole step is not the step's.
    try:
        raise KeyError("handled before the step")
    except KeyError:
        err = step("ff-inside-except", False)
    assert not err, f"a step run inside an except block saved nothing ({err})"
    err = step("ff-ok", False)
    assert not err, f"a step whose forward returned saved nothing ({err})"
    vc.out(ok=True)
    w.shutdown()


def role_down(sock):
    from kvcache.vllm.connector import _Load, _Save
    w, kv, _ = worker(sock, "LBNHC")
    err, loaded = do_load(w, meta(loads=[_Load("r", hashes("down", 3), [1, 2, 3])]))
    assert err == {1, 2, 3}, err
    assert loaded.loaded == {"r"}
    do_save(w, meta(saves=[_Save("s", hashes("down", 1), None, [4], list(range(vc.BS)))]))
    st = w.get_kv_connector_stats()
    assert st.data["save_failures"] == 1 and st.data["load_errors"] == 3, st.data
    vc.out(ok=True)
    w.shutdown()


def main():
    import kvt
    kvt.need_bins()
    d = kvt.tmpdir()
    # World-connectable: the namespace refusal is tried by another uid when
    # this test runs as root (root may open every namespace).
    daemon = kvt.Daemon(d, "--pool-size", "8MiB", "--segment-size", "4MiB", "--page-size",
                        "64KiB", "--socket-mode=0666")
    env = dict(os.environ, KVT_ADMIN=daemon.admin)

    def run(*args, user=None):
        e = env
        if user is not None:
            home = os.path.join(d, "home-%d" % user)
            os.makedirs(home, exist_ok=True)
            os.chown(home, user, user)
            os.chmod(d, 0o755)
            e = dict(env, HOME=home)
        return vc.run_child(__file__, list(args), daemon.log, timeout=800, env=e, user=user,
                            what=f"{args[0]} {str(args[2:])[:200]}")

    # Pairs whose kvcached bytes agree: same physical order of a block's
    # H and N (the pool's name carries it), any placement of layers/blocks.
    # Kernel blocks smaller than the manager's (8 of 16 tokens) on one side
    # or both: the bytes in kvcached are the unsplit block's, so an engine
    # that splits and one that does not share (HND too, where a split
    # block's heads interleave with its kernel blocks).
    pairs = [("LBNHC", "BLNHC", 0, 0), ("BLNHC", "LBNHC", 0, 0), ("LBHNC", "BLHNC", 0, 0),
             ("LHBNC", "BHLNC", 0, 0), ("LBNHC", "LBNHC", 8, 8), ("LBHNC", "LBHNC", 8, 8),
             ("LBHNC", "LBHNC", 8, 0), ("LBHNC", "LBHNC", 0, 8), ("LBHNC", "BLHNC", 8, 0),
             ("LBNHC", "BLNHC", 8, 0)]
    wf = os.path.join(d, "want.json")
    with open(wf, "w") as f:
        json.dump(run("save", daemon.sock, json.dumps(pairs)), f)
    run("load", daemon.sock, json.dumps(pairs), wf)
    for a, b, ka, kb in pairs:
        print(f"{a} (kernel block {ka or vc.BS}) -> {b} (kernel block {kb or vc.BS}): "
              "byte-exact")
    run("failfwd", daemon.sock)
    print("a step whose forward raised (vLLM's own _get_kv_connector_output): nothing sealed")
    run("refused", daemon.sock, "namespace", user=54321 if os.getuid() == 0 else None)
    print("namespace refused: every block a load error, saves skipped, one ERROR naming the "
          "uid and the namespace, no retries")
    # Full: another client holds every page of the daemon.
    import kvcache
    hog = kvcache.connect(daemon.sock)
    hp = hog.register_pool("hog", 64 << 10, 16)
    held = []
    try:
        while True:
            held += hog.alloc(hp, 1)
    except kvcache.KvError as e:
        kvt.check(e.code == kvcache.ENOSPC, f"hog: {e}")
    run("refused", daemon.sock, "full")
    print(f"full ({len(held)} blocks of 64 KiB held elsewhere): saves skipped")
    hog.close()
    # The daemon lost and back under a running worker: one line each.
    p = vc.start_child(__file__, ["lostback", daemon.sock], env=env)

    def until(word):
        while True:
            ln = p.readline()
            if not ln:
                sys.stderr.write(p.finish(60)[2][-6000:])
                kvt.fail(f"lostback died before {word}", daemon.log)
            if ln.strip() == word:
                return
    until("UP")
    daemon.kill()
    p.send("go\n")
    until("LOST")
    daemon = kvt.Daemon(d, "--pool-size", "8MiB", "--segment-size", "4MiB", "--page-size",
                        "64KiB", log="log2")
    p.send("go\n")
    rc, o, e = p.finish(300)
    if rc != 0 or 'RESULT {"ok": true}' not in o:
        sys.stderr.write(o[-3000:] + e[-6000:])
        kvt.fail("lostback failed", daemon.log)
    print("daemon lost and back: one WARNING, one INFO")
    daemon.kill()
    run("down", daemon.sock)
    print("daemon down: every block a load error, saves skipped")
    kvt.cleanup()
    print("PASS")


if __name__ == "__main__":
    vc.main_or_child(main, {"save": role_save, "load": role_load, "down": role_down,
                            "failfwd": role_failfwd, "lostback": role_lostback,
                            "refused": role_refused})
