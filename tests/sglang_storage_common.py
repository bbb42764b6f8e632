"""SGLang instances' storage side for the kvcache.sglang tests
(tests/test_sglang_*.py): SGLang 0.5.23's own CPU device pools and host pools
(MHA and MLA, every host layout, pin_memory=False: pinning needs CUDA), the
backend loaded by SGLang's own StorageBackendFactory from the ``dynamic``
configuration, and page bytes that depend only on a seed, so a page loaded
from kvcached is checked byte for byte against what its writer held.

Runs under the SGLang virtual environment (scripts/sglang-env, see
tests/sglang_env.py). A test's instances run in processes of their own,
forked from the test's process with SGLang already imported
(tests/forkchild.py)."""
import hashlib
import json
import os
import subprocess

PAGE = 4            # tokens a page
LAYERS = 3
HEADS, HEAD = 2, 16
LORA, ROPE = 32, 8  # MLA's kv_lora_rank, qk_rope_head_dim
TOKENS = 128        # device pool tokens (the host pool gets twice that)
LAYOUTS = ("layer_first", "page_first", "page_first_direct")
KINDS = ("mha", "mla")
MODEL = "kvt/tiny-sglang"


def device_pool(kind):
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
    if kind == "mha":
        return MHATokenToKVPool(TOKENS, PAGE, torch.float16, HEADS, HEAD, LAYERS, "cpu", False,
                                start_layer=0, end_layer=LAYERS - 1)
    return MLATokenToKVPool(TOKENS, PAGE, torch.bfloat16, LORA, ROPE, LAYERS, "cpu", False,
                            start_layer=0, end_layer=LAYERS - 1)


def host_pool(kind, layout, dev=None):
    """SGLang's own host pool for a CPU device pool, as its
    _build_mha_mla_host_pool makes it, but unpinned."""
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    dev = dev or device_pool(kind)
    # SGLang checks a pool against the machine's free memory less a reserve
    # of its own (several GB, more than a busy shared machine has free);
    # these pools are a few KB: book them against a budget of their size.
    with host_memory_budget_scope(64 << 20):
        return _host_pool(kind, layout, dev, MLATokenToKVPoolHost)


def _host_pool(kind, layout, dev, MLATokenToKVPoolHost):
    kw = dict(host_to_device_ratio=2.0, host_size=0, page_size=PAGE, layout=layout,
              pin_memory=False, allocator_type="default", pool_label="kv")
    if kind == "mha":
        from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _mha_host_inputs
        cls, inp, hkw = _mha_host_inputs(dev)
        return cls(inp, **hkw, **kw)
    return MLATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info,
                                device_capacity_tokens=dev.size, start_layer=dev.start_layer,
                                end_layer=dev.end_layer, target_layer_num=dev.layer_num,
                                override_kv_cache_dim=dev.kv_cache_dim, **kw)


def seed(tag):
    return int.from_bytes(hashlib.sha256(tag.encode()).digest()[:4], "little")


def fill(hp, seed):
    """Every byte of the host pool from a seed."""
    import torch
    raw = hp.kv_buffer.view(-1).view(torch.uint8)
    g = torch.Generator().manual_seed(seed)
    raw.copy_(torch.randint(0, 256, (raw.numel(),), generator=g, dtype=torch.uint8))


def page_digest(hp, page):
    """SHA-256 of page ``page``'s bytes as SGLang's own get_data_page sees them."""
    import torch
    t = hp.get_data_page(page * PAGE, flat=True).contiguous().view(torch.uint8)
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def indices(pages):
    import torch
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE, dtype=torch.int64) for p in pages])


def keys(tag, n):
    """Page keys as SGLang makes them: a hex SHA-256 chain."""
    out, h = [], tag.encode()
    for i in range(n):
        h = hashlib.sha256(h + b"/%d" % i).digest()
        out.append(h.hex())
    return out


def storage_config(kind, layout, extra, tp=(0, 1), model=MODEL):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    return HiCacheStorageConfig(tp_rank=tp[0], tp_size=tp[1], pp_rank=0, pp_size=1,
                                attn_cp_rank=0, attn_cp_size=1, is_mla_model=kind == "mla",
                                enable_storage_metrics=True,
                                is_page_first_layout=layout != "layer_first",
                                model_name=model, extra_config=extra)


def dynamic_extra(sock, v1=True, **more):
    ex = {"backend_name": "kvcached", "module_path": "kvcache.sglang",
          "class_name": "KvcachedStorage", "socket": sock, "retry_s": 0.05}
    if v1:
        ex["interface_v1"] = 1
    ex.update(more)
    return ex


def backend(kind, layout, hp, extra, tp=(0, 1), model=MODEL):
    """The backend as SGLang's HybridCacheController attaches it: made by
    StorageBackendFactory from the dynamic configuration, then given the
    host pool."""
    from sglang.srt.mem_cache.storage import StorageBackendFactory
    b = StorageBackendFactory.create_backend("dynamic",
                                             storage_config(kind, layout, extra, tp, model), hp)
    b.register_mem_pool_host(hp)
    return b


def kvctl_json(kvctl, admin, *args):
    r = subprocess.run([kvctl, "-s", admin, "-o", "json", *args], capture_output=True,
                       text=True, timeout=30)
    if r.returncode != 0:
        raise AssertionError("kvctl %s: %s" % (" ".join(args), r.stderr))
    return json.loads(r.stdout)


def refs(pid=None):
    """References the daemon counts for this pid's connections."""
    j = kvctl_json(os.environ["KVCTL_BIN"], os.environ["KVT_ADMIN"], "clients")
    pid = pid or os.getpid()
    return sum(c.get("refs", 0) for c in j.get("clients", []) if c.get("pid") == pid)


def clients():
    j = kvctl_json(os.environ["KVCTL_BIN"], os.environ["KVT_ADMIN"], "clients")
    return j.get("clients", [])


def result(obj):
    """A child's result: one line of JSON, the one write_then_read reads."""
    print("RESULT " + json.dumps(obj), flush=True)


# What a child imports, imported once by the process the children are forked
# from (tests/forkchild.py): about 11 s of CPU a python on the CI machine.
PRELOAD = ["torch", "torch.distributed", "sglang.srt.mem_cache.memory_pool",
           "sglang.srt.mem_cache.pool_host.base", "sglang.srt.mem_cache.pool_host.mla",
           "sglang.srt.mem_cache.pool_host.group",
           "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler",
           "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller",
           "sglang.srt.mem_cache.allocator.paged", "sglang.srt.mem_cache.hicache_storage",
           "sglang.srt.mem_cache.storage", "sglang.srt.mem_cache.utils",
           "sglang.srt.mem_cache.base_prefix_cache", "sglang.srt.runtime_context",
           "kvcache.sglang"]


def preload():
    """forkchild.preload(PRELOAD)."""
    import forkchild
    forkchild.preload(PRELOAD)


def run_child(script, args, env, log, roles=None, timeout=600):
    """`script --child ARGS...` in a process of its own (forkchild.run:
    forked from this one, running roles[ARGS[0]], when it can); its "ok:"
    lines printed; fails the test with its output and the daemon's log (log)
    when it exits non-zero, prints no RESULT line or runs past timeout
    seconds. Returns its last RESULT line decoded."""
    import sys

    import forkchild
    res, o, _ = forkchild.run(script, args, log, args[0], timeout=timeout, env=env, roles=roles)
    sys.stdout.write("".join(ln + "\n" for ln in o.splitlines() if ln.startswith("ok:")))
    return res


def write_then_read(script, roles):
    """A test script's entry. As `--child ROLE ARGS...`: runs roles[ROLE].
    Otherwise: one daemon, `script --child write` in one process and then
    `--child read WANT` in another (WANT: what the writer returned), each
    forked from this one with SGLang imported (preload, tests/forkchild.py),
    each one's "ok:" lines printed; the test fails when either fails or the
    reader's result is not "ok"."""
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import forkchild
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        sys.exit(forkchild.run_role(sys.argv[2:], roles))
    import kvt
    try:
        kvt.need_bins()
        preload()
        forkchild.set_roles(roles)
        d = kvt.tmpdir()
        daemon = kvt.Daemon(d, "--pool-size", "16MiB", "--segment-size", "4MiB",
                            "--page-size", "64KiB")
        env = dict(os.environ, KVT_ADMIN=daemon.admin, KVT_SOCK=daemon.sock)
        want = run_child(script, ["write"], env, daemon.log)
        kvt.check(run_child(script, ["read", json.dumps(want)], env, daemon.log) == "ok",
                  "read", daemon.log)
    finally:
        kvt.cleanup()   # the daemons it started
