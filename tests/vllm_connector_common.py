"""A vLLM instance for the connector tests (tests/test_vllm_connector*.py):
vLLM 0.33's real Scheduler with KvcachedConnector on both sides, and a
worker side whose KV cache is CPU tensors laid out by vLLM's own
create_kv_cache_views. The "model" writes into each token's KV slot bytes
that depend only on the tokens up to it, the cache salt and the LoRA, so a
block loaded from kvcached can be checked byte for byte against what this
process would have computed; every step checks every token the scheduled
requests have computed so far (local prefix-cache hits and loads alike).

Runs under the vLLM virtual environment (scripts/vllm-env): ``need_vllm()``
re-executes the calling script with its python, or exits 77. A test's
instances run in processes of their own (run_child, start_child), forked
from the test's process with vLLM already imported (tests/forkchild.py).
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import forkchild  # noqa: E402  (tests/forkchild.py)

SRC = os.environ.get("MESON_SOURCE_ROOT",
                     os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BS = 16
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
HEADS, HEAD = 2, 16


def need_vllm():
    """Re-executes the caller under the vLLM venv's python unless vllm and
    torch are installed here (found, not imported: importing them is 7.5 s
    of CPU, wasted where the caller only runs other processes); exits 77
    when there is none."""
    import importlib.util
    if importlib.util.find_spec("vllm") and importlib.util.find_spec("torch"):
        return
    if os.environ.get("KVT_VLLM_REEXEC"):
        print("SKIP: vllm or torch is not installed in", sys.executable)
        sys.exit(77)
    r = subprocess.run([os.path.join(SRC, "scripts", "vllm-env"), "--path"],
                       capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.strip():
        print("SKIP: no vLLM environment (scripts/vllm-env makes it)")
        sys.exit(77)
    py = r.stdout.strip()
    os.environ["KVT_VLLM_REEXEC"] = "1"
    # No OpenBLAS thread pool (numpy's, OpenCV's: one thread each here): the
    # children are forked from this process (tests/forkchild.py).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # Nor the two background pythons that importing `humming` (vLLM's
    # quantization kernels; a KV dtype's config imports it) starts to build
    # its CUDA launchers: about 9 s of CPU, for nothing on a CPU, and a
    # thread in this process that waits for them.
    os.environ.setdefault("HUMMING_DISABLE_PARALLEL_BUILD", "1")
    os.execv(py, [py] + sys.argv)


def model_dir():
    d = os.path.join(tempfile.gettempdir(), "kvt-vllm-model-%d" % os.getuid())
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, "config.json")
    if not os.path.exists(p):
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
               "intermediate_size": 128, "num_attention_heads": 4,
               "num_key_value_heads": HEADS, "num_hidden_layers": len(LAYERS),
               "vocab_size": 1000, "max_position_embeddings": 4096, "torch_dtype": "float16",
               "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2}
        tmp = p + ".%d" % os.getpid()
        with open(tmp, "w") as f:
            json.dump(cfg, f)
        os.replace(tmp, p)
    return d


class Instance:
    """One vLLM engine: Scheduler + worker-side connector, in this process.

    windows: a hybrid (Gemma-2-like) model instead of the two-layer one:
    one entry a layer, None for full attention, else the layer's sliding
    window; vLLM's own planner groups the layers (get_global_kv_cache_groups,
    get_kv_cache_configs) with its hybrid allocator on, and allocate_kv_cache
    lays the views out (a layer of each group over the same memory)."""

    def __init__(self, sock, layout="LBNHC", num_blocks=64, extra=None, batched=256,
                 policy="recompute", kv_role="kv_both", hf_overrides=None, windows=None):
        import torch
        from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                                 SchedulerConfig, VllmConfig)
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                                KVCacheGroupSpec, KVCacheTensor,
                                                SlidingWindowSpec, compute_layout_strides,
                                                create_kv_cache_views)
        from vllm.v1.kv_cache_layout import KVCacheLayout
        from vllm.v1.structured_output import StructuredOutputManager

        from kvcache.vllm import KvcachedConnector

        self.torch = torch
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(BS, sha256)
        ex = {"socket": sock, "model": "kvt-tiny-llama", "lookup_timeout_ms": 10000,
              "retry_s": 0.05}
        ex.update(extra or {})
        mc = ModelConfig(model=model_dir(), skip_tokenizer_init=True, dtype="float16", seed=0,
                         max_model_len=4096, hf_overrides=hf_overrides or {})
        sc = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=batched, max_model_len=4096,
                             enable_chunked_prefill=True, is_encoder_decoder=False)
        cc = CacheConfig(block_size=BS, gpu_memory_utilization=0.9, cache_dtype="auto",
                         enable_prefix_caching=True)
        cc.kv_cache_layout = layout
        kt = KVTransferConfig(kv_connector="KvcachedConnector",
                              kv_connector_module_path="kvcache.vllm", kv_role=kv_role,
                              kv_connector_extra_config=ex, kv_load_failure_policy=policy)
        vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc,
                        kv_transfer_config=kt, device_config=DeviceConfig("cpu"))
        spec = FullAttentionSpec(block_size=BS, num_kv_heads=HEADS, head_size=HEAD,
                                 dtype=torch.float16)
        lay = KVCacheLayout[layout]
        self.layers = list(LAYERS)
        if windows is not None:
            from vllm.v1.core.kv_cache_planning import (get_global_kv_cache_groups,
                                                        get_kv_cache_configs)
            from vllm.v1.worker.utils import allocate_kv_cache
            # The CPU platform turns the hybrid allocator off; the engines
            # these tests stand for (CUDA) keep it, the connector being
            # SupportsHMA (checked by the caller).
            vc.scheduler_config.disable_hybrid_kv_cache_manager = False
            self.layers = ["model.layers.%d.self_attn.attn" % i for i in range(len(windows))]
            specs = {}
            for name, w in zip(self.layers, windows):
                specs[name] = (spec if w is None else SlidingWindowSpec(
                    block_size=BS, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float16,
                    sliding_window=w))
            groups = get_global_kv_cache_groups(vc, [specs])
            kvc = get_kv_cache_configs(vc, [specs], [spec.page_size_bytes * num_blocks *
                                                     len(groups)], groups)[0]
            num_blocks = kvc.num_blocks
        else:
            n = len(LAYERS)
            # Strides as vLLM's planner computes them (kv_cache_planning.py).
            ls, bstride = compute_layout_strides(spec, num_blocks, n, lay)[:2]
            t = KVCacheTensor(size=spec.page_size_bytes * num_blocks * n, layers=list(LAYERS),
                              layer_stride=ls, block_stride=bstride)
            kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[t],
                                kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)])
        self.kvc = kvc
        # Per group: its layers' indices and its window (None: full).
        self.groups = [([self.layers.index(x) for x in g.layer_names],
                        getattr(g.kv_cache_spec, "sliding_window", None)
                        if isinstance(g.kv_cache_spec, SlidingWindowSpec) else None)
                       for g in kvc.kv_cache_groups]
        vc.cache_config.num_gpu_blocks = num_blocks
        self.sched = Scheduler(vllm_config=vc, kv_cache_config=kvc, log_stats=True,
                               structured_output_manager=StructuredOutputManager(vc),
                               block_size=BS)
        self.conn = self.sched.connector
        assert isinstance(self.conn, KvcachedConnector), type(self.conn)
        self.null_id = self.sched.kv_cache_manager.block_pool.null_block.block_id
        if windows is not None:
            self.kv = allocate_kv_cache(kvc, torch.device("cpu"), lay)
        else:
            self.raw = torch.zeros(t.size, dtype=torch.int8)
            views = create_kv_cache_views(self.raw, spec, num_blocks, lay, t)
            self.kv = dict(zip(LAYERS, views))
        self.worker = KvcachedConnector(vc, KVConnectorRole.WORKER, kvc)
        self.worker.register_kv_caches(self.kv)
        self.reqs = {}
        self.first_sched = {}       # request id -> tokens scheduled the first time
        self.finished = set()
        self.preempted = set()
        self.load_errors = 0
        self.stats = {}

    # -- the fake model --

    def _key(self, r, p):
        salt = r.cache_salt or ""
        lora = r.lora_request.lora_name if r.lora_request else ""
        toks = r.all_token_ids[:p + 1]
        return hashlib.sha256(repr((salt, lora, list(toks))).encode()).digest()

    def _slot(self, li, b, off):
        v = self.kv[self.layers[li]].view(self.torch.uint8)    # [B, H, N, C bytes]
        return v[b, :, off, :]

    def _expect(self, r, p, li):
        d = self._key(r, p) + bytes([li])
        need = HEADS * 2 * HEAD * 2
        full = (hashlib.sha256(d).digest() * (need // 32 + 1))[:need]
        return self.torch.frombuffer(bytearray(full), dtype=self.torch.uint8).view(HEADS, -1)

    def add(self, rid, tokens, max_tokens=4, salt=None, lora=None):
        from vllm import SamplingParams
        from vllm.lora.request import LoRARequest
        from vllm.v1.request import Request
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        sp.update_from_generation_config({}, 2)
        # Its id differs from process to process, the name does not.
        lr = LoRARequest(lora, hash((lora, os.getpid())) % 1000 + 1,
                         "/nonexistent/" + lora) if lora else None
        r = Request(request_id=rid, prompt_token_ids=list(tokens), sampling_params=sp,
                    pooling_params=None, mm_features=None, block_hasher=self.hasher,
                    cache_salt=salt, lora_request=lr)
        self.reqs[rid] = r
        self.sched.add_request(r)
        return r

    def step(self):
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
        so = self.sched.schedule()
        for rid in so.preempted_req_ids or ():
            self.preempted.add(rid)
        w = self.worker
        w.bind_connector_metadata(so.kv_connector_metadata)
        w.start_load_kv(None)
        errors = w.get_block_ids_with_load_errors()
        self.load_errors += len(errors)
        for rid, n in so.num_scheduled_tokens.items():
            r = self.reqs[rid]
            self.first_sched.setdefault(rid, n)
            per_group = self.sched.kv_cache_manager.get_block_ids(rid)
            done = r.num_computed_tokens - n     # schedule() already counted this step's
            for (lis, win), ids in zip(self.groups, per_group):
                bad = any(ids[p // BS] in errors for p in range(done))
                if bad:
                    continue
                for p in range(done):      # what attention would read
                    if ids[p // BS] == self.null_id:
                        # Only a window's skipped tokens may be vLLM's null block.
                        if win is None or p >= done - win + 1:
                            raise AssertionError(f"{rid}: token {p} of layers {lis} in the "
                                                 "null block")
                        continue
                    for li in lis:
                        got = self._slot(li, ids[p // BS], p % BS)
                        if not self.torch.equal(got, self._expect(r, p, li)):
                            raise AssertionError(f"{rid}: token {p} layer {li}: wrong KV bytes")
                for p in range(done, done + n):  # the forward writes this step's tokens
                    for li in lis:
                        self._slot(li, ids[p // BS], p % BS).copy_(self._expect(r, p, li))
        w.wait_for_save()
        # Asynchronous loads that ended: their requests and failed blocks
        # (a hybrid model's failed loads as failed_recving, per request).
        tr = w.get_transfer_results(set(so.finished_req_ids))
        recving = tr.finished_recving
        failed = set(getattr(tr, "failed_recving", ()) or ())
        self.failed_loads = getattr(self, "failed_loads", 0) + len(failed)
        late = w.get_block_ids_with_load_errors()
        self.load_errors += len(late)
        errors = errors | late
        st = w.get_kv_connector_stats()
        if st is not None:
            for k, v in st.data.items():
                self.stats[k] = self.stats.get(k, 0) + v
        out = KVConnectorOutput(invalid_block_ids=errors, finished_recving=recving or set(),
                                failed_recving=failed,
                                kv_connector_worker_meta=w.build_connector_worker_meta())
        w.clear_connector_metadata()
        req_ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in req_ids:
            r = self.reqs[rid]
            end = r.num_computed_tokens
            # A chunk that does not finish the prompt samples nothing.
            if end < r.num_tokens:
                sampled.append([])
            else:
                sampled.append([3 + (sum(r.all_token_ids) * 31 + end) % 900])
        mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in
                                                                  enumerate(req_ids)},
                                sampled_token_ids=sampled, logprobs=None,
                                prompt_logprobs_dict={}, pooler_output=[],
                                kv_connector_output=out)
        eco = self.sched.update_from_output(so, mro)
        for v in eco.values():
            for o in v.outputs:
                if o.finish_reason is not None:
                    self.finished.add(o.request_id)
        for rid in so.finished_req_ids:
            self.finished.add(rid)
        return so

    def run(self, limit=500):
        for _ in range(limit):
            if not self.sched.has_unfinished_requests():
                return
            so = self.step()
            if so.total_num_scheduled_tokens == 0:
                # Nothing to run: a lookup is pending (answered None) or an
                # asynchronous load; wait for the connector's threads rather
                # than spin.
                self.conn.drain()
                self.wait_loads()
        raise AssertionError("requests did not finish in %d steps" % limit)

    def wait_loads(self, timeout=60):
        """Waits until the worker side's asynchronous loads have ended."""
        import concurrent.futures
        fl = list(self.worker.connector_worker._inflight.values())
        if fl:
            concurrent.futures.wait(fl, timeout=timeout)

    def abort(self, rid):
        from vllm.v1.request import RequestStatus
        self.sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)

    def held(self):
        self.conn.drain()
        return self.conn.held_references()

    def close(self):
        self.worker.shutdown()
        self.conn.shutdown()


def kvctl_refs(kvctl, admin, pid):
    """References the daemon counts for this pid's connections."""
    r = subprocess.run([kvctl, "-s", admin, "-o", "json", "clients"], capture_output=True,
                       text=True, timeout=30)
    if r.returncode != 0:
        raise AssertionError("kvctl clients: " + r.stderr)
    j = json.loads(r.stdout)
    return sum(c.get("refs", 0) for c in j.get("clients", []) if c.get("pid") == pid)


SYSTEM = [100 + (i * 7) % 800 for i in range(4 * BS)]     # 4 blocks of system prompt


def user(seed, n=40):
    return [100 + (seed * 13 + i * 11) % 800 for i in range(n)]


# --- the tests' processes: a script's main() starts children of itself -----
#
# Forked (tests/forkchild.py): this process imports torch, vLLM and
# kvcache.vllm once (preload(), about 8 s of CPU on the CI machine) and each
# child is os.fork()ed from it rather than a new python importing them again.
# Each child is still its own process, with its own pid, uid when asked, and
# its own connections to the daemon, made after the fork.

PRELOAD = ["torch", "vllm", "vllm.config", "vllm.lora.request", "vllm.utils.hashing",
           "vllm.distributed.kv_transfer.kv_connector.v1.base",
           "vllm.distributed.kv_transfer.kv_connector.factory",
           "vllm.v1.core.kv_cache_utils", "vllm.v1.core.sched.scheduler",
           "vllm.v1.core.sched.output", "vllm.v1.kv_cache_interface",
           "vllm.v1.kv_cache_layout", "vllm.v1.outputs", "vllm.v1.request",
           "vllm.v1.structured_output", "vllm.v1.executor", "vllm.tracing",
           "vllm.model_executor.model_loader",
           "transformers.models.llama.configuration_llama", "kvcache.vllm.connector"]


def preload():
    """forkchild.preload(PRELOAD)."""
    forkchild.preload(PRELOAD)


def out(**kw):
    """A child's result: one line of JSON, the one run_child returns."""
    print("RESULT " + json.dumps(kw), flush=True)


def start_child(script, args, env=None, user=None):
    """forkchild.start_child: `script --child ARGS...` as a Child."""
    return forkchild.start_child(script, args, env=env, user=user)


def run_child(script, args, log, timeout=600, env=None, what=None, user=None):
    """Runs `script --child ARGS...` (start_child: its own process, as uid
    and gid user when given) and returns its last RESULT line decoded; fails
    the test with the child's output and the daemon's log (log) when it
    exits non-zero, prints none or runs past timeout seconds
    (forkchild.run)."""
    what = "instance " + (what or " ".join(args[:1])[:200])
    res, _, what = forkchild.run(script, args, log, what, timeout=timeout, env=env, user=user)
    print(f"{what}: {json.dumps(res)[:300]}")
    return res


def main_or_child(main, roles):
    """A test script's entry: re-executed under the vLLM environment
    (need_vllm), it runs roles[ROLE](ARGS...) when called as
    `--child ROLE ARGS...` (a failed assertion is a FAIL line and exit 1),
    main() otherwise, with vLLM preloaded for the children start_child
    forks. roles may be one function, which takes ROLE too."""
    need_vllm()
    forkchild.set_roles(roles)
    if len(sys.argv) < 2 or sys.argv[1] != "--child":
        preload()
        main()
        return
    sys.exit(forkchild.run_role(sys.argv[2:]))
