"""KvcachedConnector: vLLM's KV connector API (KVConnectorBase_V1) over
kvcached (docs/vllm.md).

Scheduler side (one per engine): ``get_num_new_matched_tokens`` looks up the
request's own ``block_hashes`` beyond vLLM's local hit in kvcached's prefix
index, on a thread of its own (a lookup that waits on a promotion from the
host or disk tier answers ``None`` - "ask again" - rather than block the
scheduler); the references the lookup took keep the blocks from eviction
until the worker has loaded them, the request ends, or it is preempted.
``build_connector_meta`` hands the worker this step's loads (hashes + vLLM
block ids) and saves (full blocks that this step completes, with hashes,
parent and token ids).

Worker side (one per GPU worker): ``register_kv_caches`` reads vLLM's
per-layer views (kvcache.vllm.datapath) and registers the pool of this
model, layout and TP rank; ``start_load_kv`` looks the hashes up again on
its own connection (taking its own references, mapping the blocks), copies
every layer in one batch per layer, and reports the blocks it could not load
through ``get_block_ids_with_load_errors`` (vLLM recomputes them);
``wait_for_save`` allocates, copies out, seals with vLLM's hashes and token
ids, and releases.

Failures never fail a request: with kvcached down, restarting, full or
refusing, a lookup finds nothing, a save is skipped, a load reports its
blocks as errors. References are taken only by lookup, alloc and seal, and
every path that took one releases it (or the daemon dropped it with the
connection).

Threads: the scheduler side's connection is used only by its one ops
thread; the worker side's only by the worker's thread.
"""
from __future__ import annotations

import concurrent.futures as _fut
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

import vllm

from . import SUPPORTED_VLLM


def _check_version() -> None:
    v = getattr(vllm, "__version__", "?")
    if os.environ.get("KVCACHE_VLLM_ANY_VERSION") == "1":
        return
    if not any(v == s or v.startswith(s + ".") for s in SUPPORTED_VLLM):
        raise ImportError(
            f"kvcache.vllm: vLLM {v} is not supported (this connector supports vLLM "
            f"{', '.join(s + '.x' for s in SUPPORTED_VLLM)}: its KV connector API and "
            "per-layer KV views). Install a supported vLLM, or set "
            "KVCACHE_VLLM_ANY_VERSION=1 to try anyway.")


_check_version()

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, KVConnectorWorkerMetadata)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    generate_block_hash_extra_keys, to_event_extra_keys)
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec, compute_layer_kv_cache_shape_bytes)

import kvcache  # noqa: E402

from .datapath import BlockLayout, analyze_layer, make_copier, physical_order  # noqa: E402

log = logging.getLogger("kvcache.vllm")


# -- metadata, scheduler -> worker and back (pickled by vLLM) --

@dataclass
class _Load:
    req_id: str
    hashes: List[bytes]        # kvcached hashes of the blocks to load, a chain
    block_ids: List[int]       # vLLM block ids to load into, same length


@dataclass
class _Save:
    req_id: str
    hashes: List[bytes]
    parent: Optional[bytes]    # kvcached hash before hashes[0]; None at the head
    block_ids: List[int]
    token_ids: List[int]       # len(hashes) * block_size
    # For kvcached's KV events, what vLLM's own BlockStored says of these
    # blocks (_event_meta): the LoRA and each block's untagged extra keys.
    lora_name: Optional[str] = None
    lora_id: Optional[int] = None
    extra_keys: Optional[List[Any]] = None


@dataclass
class KvcachedConnectorMetadata(KVConnectorMetadata):
    loads: List[_Load] = field(default_factory=list)
    saves: List[_Save] = field(default_factory=list)


@dataclass
class KvcachedWorkerMetadata(KVConnectorWorkerMetadata):
    """Requests whose loads the worker finished (or gave up on): the
    scheduler side drops the references its lookup held for them."""
    loaded: Set[str] = field(default_factory=set)

    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
        if isinstance(other, KvcachedWorkerMetadata):
            return KvcachedWorkerMetadata(self.loaded | other.loaded)
        return self


_COUNTERS = ("lookups", "lookups_deferred", "lookup_hit_blocks", "lookup_failures",
             "loaded_blocks",
             "loaded_bytes", "load_errors", "saved_blocks", "saved_bytes", "save_failures",
             "load_seconds", "save_seconds")


@dataclass
class KvcachedConnectorStats(KVConnectorStats):
    """Counters since the last report: lookups and the blocks they found,
    blocks and bytes loaded and saved, load errors, saves skipped (kvcached
    down, full or refusing), and the seconds the copies took."""

    def __post_init__(self):
        for k in _COUNTERS:
            self.data.setdefault(k, 0)

    def reset(self):
        self.data = {k: 0 for k in _COUNTERS}

    def add(self, key: str, n) -> None:
        self.data[key] = self.data.get(key, 0) + n

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k, v in (other.data or {}).items():
            if isinstance(v, (int, float)):
                self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> Dict[str, Any]:
        d = dict(self.data)
        for what in ("load", "save"):
            s = d.get(f"{what}_seconds", 0)
            b = d.get("loaded_bytes" if what == "load" else "saved_bytes", 0)
            d[f"{what}_GBps"] = round(b / s / 1e9, 3) if s > 0 else 0.0
        return d

    def is_empty(self) -> bool:
        return not any(self.data.get(k) for k in _COUNTERS)


# -- helpers --

def _kh(h) -> bytes:
    """kvcached's 32-byte key for one of vLLM's block hashes: the hash itself
    (sha256, sha256_cbor: vLLM's default), else its SHA-256 (xxhash)."""
    h = bytes(h)
    if len(h) == kvcache.HASH_BYTES:
        return h
    return hashlib.sha256(b"kvcached/vllm-block-hash\0" + h).digest()


def _event_meta(req, a: int, b: int, bs: int):
    """What vLLM's own BlockStored says of blocks [a, b) of req besides
    their hashes and tokens, made by vLLM's own functions as its block pool
    makes it (vllm/v1/core/block_pool.py cache_full_blocks): (lora_name,
    lora_id, extra_keys), extra_keys one entry per block, untagged
    (to_event_extra_keys). kvcached's events then carry the same."""
    lr = getattr(req, "lora_request", None)
    keys, mm = [], 0
    for i in range(a, b):
        k, mm = generate_block_hash_extra_keys(req, i * bs, (i + 1) * bs, mm)
        keys.append(k)
    return (lr.name if lr else None, lr.adapter_id if lr else None,
            to_event_extra_keys(keys))


def _dtype_name(dt) -> str:
    s = str(dt).replace("torch.", "")
    return {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32",
            "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2", "uint8": "u8"}.get(s, s)


def _tp() -> Tuple[int, int]:
    try:
        from vllm.distributed.parallel_state import (get_tensor_model_parallel_rank,
                                                     get_tensor_model_parallel_world_size)
        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    except Exception:
        return 0, 1


class _PoolSpec:
    """The kvcached pool of one model, layout and TP rank, as both sides
    compute it from vLLM's configuration: same name, block size and layout
    bytes in every engine that can share the blocks, different ones where
    the bytes would differ."""

    def __init__(self, vllm_config, kv_cache_config, extra: dict, tp_rank: int):
        groups = kv_cache_config.kv_cache_groups
        if len(groups) != 1 or not isinstance(groups[0].kv_cache_spec, FullAttentionSpec):
            kinds = [type(g.kv_cache_spec).__name__ for g in groups]
            raise ValueError("KvcachedConnector supports models whose KV cache is one group of "
                             f"full attention layers; this one has {kinds} (hybrid, sliding-"
                             "window-only and Mamba models are not supported yet)")
        spec = groups[0].kv_cache_spec
        self.layer_names = list(groups[0].layer_names)
        self.block_size = spec.block_size
        shape = compute_layer_kv_cache_shape_bytes(spec, 1)    # (1, H, N, C bytes)
        self.layer_bytes = int(shape[1] * shape[2] * shape[3])
        self.order, layout_name = None, None
        try:
            from vllm.config.cache import _layout_from_name
            name = (getattr(kv_cache_config, "kv_cache_layout", None)
                    or vllm_config.cache_config.kv_cache_layout)
            if name:
                lay = _layout_from_name(name)
                self.order = physical_order(lay.layer_view_order, shape[1:])
                layout_name = lay.name
        except Exception as e:
            log.warning("kvcached: cannot tell vLLM's KV cache layout (%s)", e)
        if self.order is None:
            log.warning("kvcached: vLLM's KV cache layout is not resolved here; assuming NHD "
                        "(a worker on another layout finds no blocks this side looks up)")
        pc = vllm_config.parallel_config
        model = str(extra.get("model") or vllm_config.model_config.model)
        self.model = model
        self.tp = (tp_rank, pc.tensor_parallel_size)
        self.dtype = _dtype_name(spec.dtype)
        self.block_bytes = self.layer_bytes * len(self.layer_names)
        self._layout_name = layout_name

    def desc(self, order: str) -> Tuple[str, bytes]:
        d = {"engine": "vllm", "model": self.model, "dtype": self.dtype,
             "block_size": self.block_size, "layers": len(self.layer_names),
             "layer_bytes": self.layer_bytes, "order": order, "tp": list(self.tp)}
        lay = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
        h = hashlib.sha256(lay).hexdigest()[:12]
        base = os.path.basename(self.model.rstrip("/")) or "model"
        name = f"vllm/{base[:30]}/tp{self.tp[0]}/{h}"
        return name, lay


class _Client:
    """A kvcached connection with its pool, made lazily and again after a
    failed connect (at most once per retry interval): a daemon that is down
    at start is picked up when it comes. The library itself reconnects
    after a restart (kvcache.h)."""

    def __init__(self, extra: dict, spec: _PoolSpec, order: str, role: str):
        self.socket = extra.get("socket") or None
        self.namespace = extra.get("namespace") or None
        self.retry_s = float(extra.get("retry_s", 1.0))
        self.spec, self.order, self.role = spec, order, role
        self.conn: Optional[kvcache.Connection] = None
        self.pool = None
        self._next_try = 0.0
        self._warned = False

    def get(self):
        if self.conn is not None:
            return self.conn
        now = time.monotonic()
        if now < self._next_try:
            return None
        self._next_try = now + self.retry_s
        c = None
        try:
            c = kvcache.connect(self.socket, self.namespace, f"vllm-{self.role}-{os.getpid()}")
            name, lay = self.spec.desc(self.order)
            self.pool = c.register_pool(name, self.spec.block_bytes, self.spec.block_size,
                                        dtype=self.spec.dtype, layout=lay, model=self.spec.model)
            self.conn = c
            self._warned = False
            log.info("kvcached: %s connected, pool %s (%d bytes a block)", self.role, name,
                     self.spec.block_bytes)
            return c
        except (kvcache.KvError, OSError) as e:
            if c is not None:
                c.close()
            if not self._warned:
                log.warning("kvcached: %s cannot use kvcached (%s); going on without it, "
                            "retrying every %.1fs", self.role, e, self.retry_s)
                self._warned = True
            return None

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


@dataclass
class _ReqState:
    request: Any
    held: List[int] = field(default_factory=list)   # scheduler refs (lookup)
    held_epoch: int = 0
    lookup: Optional[_fut.Future] = None
    lookup_at: int = -1          # num_computed_tokens the lookup was for
    asked_since: float = 0.0
    ext_blocks: int = 0          # blocks the last answer offered
    start_block: int = 0         # first block of that answer
    saved_upto: int = 0          # blocks [0, saved_upto) are in kvcached or being saved
    loading: bool = False


class KvcachedConnector(KVConnectorBase_V1):
    """vLLM's KV connector over kvcached. kv_connector_extra_config:

    - ``socket``: the daemon's socket (default: $KVCACHED_SOCKET, else
      kvcached's default path);
    - ``namespace``: the kvcached namespace (tenant) to open (default: the
      uid's own);
    - ``model``: the name engines share a pool under (default: the model
      path vLLM was given) - engines serving the same weights under
      different paths set the same value here;
    - ``lookup_timeout_ms`` (default 20): how long a lookup may make the
      scheduler wait before it answers "ask again";
    - ``lookup_deadline_ms`` (default 2000): after that long without an
      answer the request goes on without kvcached;
    - ``save`` ("all", the default; "prompt"; "none"): which full blocks go
      to kvcached;
    - ``copy_engine`` ("auto"; "cupy"; "triton"; "torch") for CUDA tensors;
    - ``retry_s`` (default 1): how often to retry a daemon that is down.
    """

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self.stats = KvcachedConnectorStats()
        self.is_scheduler = role == KVConnectorRole.SCHEDULER
        tp_rank = 0 if self.is_scheduler else _tp()[0]
        self.spec = _PoolSpec(vllm_config, kv_cache_config, self.extra, tp_rank)
        self.block_size = self.spec.block_size
        self.save_mode = str(self.extra.get("save", "all"))
        # kv_role: a consumer only loads, a producer only saves; kv_both does both.
        ktc = self._kv_transfer_config
        self.loads_on = bool(ktc.is_kv_consumer)
        if not ktc.is_kv_producer:
            self.save_mode = "none"
        if self.is_scheduler:
            self._lookup_timeout = float(self.extra.get("lookup_timeout_ms", 20)) / 1e3
            self._lookup_deadline = float(self.extra.get("lookup_deadline_ms", 2000)) / 1e3
            order = self.spec.order or "NHC"
            self.client = _Client(self.extra, self.spec, order, "scheduler")
            self._ops = _fut.ThreadPoolExecutor(1, thread_name_prefix="kvcached-sched")
            self._reqs: Dict[str, _ReqState] = {}
            self.deferred = 0            # lookups answered "ask again" (None), ever
            self._pending_loads: List[_Load] = []
        else:
            self.client = None
            self.layout: Optional[BlockLayout] = None
            self.copier = None
            self._load_errors: Set[int] = set()
            self._loaded: Set[str] = set()
            self._load_hold: List[int] = []

    # ================= scheduler side =================

    def _op_lookup(self, hashes: List[bytes]):
        """On the ops thread: (blocks, epoch) or None (no daemon)."""
        c = self.client.get()
        if c is None:
            return None
        try:
            blocks = c.lookup(self.client.pool, hashes)
            return blocks, c.restarts
        except kvcache.KvError as e:
            log.debug("kvcached: lookup failed: %s", e)
            return None

    def _op_release(self, blocks: List[int], epoch: int) -> None:
        c = self.client.conn
        if c is None or not blocks or c.restarts != epoch:
            return   # a restart dropped them with the old daemon
        try:
            c.release(blocks)
        except kvcache.KvError as e:
            log.debug("kvcached: release failed: %s", e)

    def _release_held(self, st: _ReqState, keep: int = 0) -> None:
        if len(st.held) > keep:
            drop = st.held[keep:]
            st.held = st.held[:keep]
            self._ops.submit(self._op_release, drop, st.held_epoch)

    def _drop_lookup(self, st: _ReqState) -> None:
        """Forgets a lookup; one still running releases what it finds."""
        f = st.lookup
        st.lookup = None
        st.lookup_at = -1
        if f is None or getattr(f, "_kv_taken", False):
            return
        f._kv_taken = True

        def _late(fut):
            r = None if fut.cancelled() else fut.result()
            if r:
                try:
                    self._ops.submit(self._op_release, r[0], r[1])
                except RuntimeError:
                    pass   # shut down: closing the connection dropped them
        f.add_done_callback(_late)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        rid = request.request_id
        st = self._reqs.get(rid)
        if st is None:
            st = self._reqs[rid] = _ReqState(request)
        if not self.loads_on:
            return 0, False
        bs = self.block_size
        # vLLM computes at least the last token itself.
        nfull = min(len(request.block_hashes), (request.num_tokens - 1) // bs)
        start = num_computed_tokens // bs
        if nfull <= start:
            st.saved_upto = max(st.saved_upto, start)
            return 0, False
        if st.lookup is not None and st.lookup_at != num_computed_tokens:
            self._take_lookup(st)
            self._release_held(st)
            self._drop_lookup(st)
        if st.lookup is None:
            hashes = [_kh(h) for h in request.block_hashes[start:nfull]]
            st.lookup = self._ops.submit(self._op_lookup, hashes)
            st.lookup_at = num_computed_tokens
            st.asked_since = time.monotonic()
            self.stats.add("lookups", 1)
        try:
            st.lookup.result(timeout=self._lookup_timeout)
        except _fut.TimeoutError:
            if time.monotonic() - st.asked_since < self._lookup_deadline:
                self.stats.add("lookups_deferred", 1)
                self.deferred += 1
                return None, False      # a promotion is under way: ask again later
            self._drop_lookup(st)
            self.stats.add("lookup_failures", 1)
            return 0, False
        self._take_lookup(st)
        k = len(st.held)
        st.start_block = start
        st.ext_blocks = k
        st.saved_upto = max(st.saved_upto, start + k)
        if k:
            self.stats.add("lookup_hit_blocks", k)
        return k * bs, False

    def _take_lookup(self, st: _ReqState) -> None:
        """Moves a finished lookup's blocks into st.held (once)."""
        f = st.lookup
        if f is None or not f.done() or getattr(f, "_kv_taken", False):
            return
        f._kv_taken = True
        r = f.result()
        self._release_held(st)
        if r is None:
            self.stats.add("lookup_failures", 1)
            st.held, st.held_epoch = [], 0
        else:
            st.held, st.held_epoch = list(r[0]), r[1]

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        st = self._reqs.get(request.request_id)
        if st is None:
            return
        self._take_lookup(st)
        n = num_external_tokens // self.block_size if num_external_tokens > 0 else 0
        n = min(n, len(st.held))
        self._release_held(st, keep=n)
        st.lookup = None
        st.lookup_at = -1
        if n == 0:
            return
        ids = blocks.get_block_ids()[0]
        s = st.start_block
        hashes = [_kh(h) for h in request.block_hashes[s:s + n]]
        self._pending_loads.append(_Load(request.request_id, hashes, list(ids[s:s + n])))
        st.loading = True

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = KvcachedConnectorMetadata(loads=self._pending_loads)
        self._pending_loads = []
        for rid in scheduler_output.preempted_req_ids or ():
            st = self._reqs.get(rid)
            if st is not None:
                self._release_held(st)
                self._drop_lookup(st)
                st.loading = False
        if self.save_mode == "none":
            return meta
        bs = self.block_size
        spec = scheduler_output.scheduled_spec_decode_tokens or {}
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            st = self._reqs.get(rid)
            if st is None:
                continue
            req = st.request
            end = req.num_computed_tokens + n - len(spec.get(rid, ()))
            if self.save_mode == "prompt":
                end = min(end, req.num_prompt_tokens)
            full = min(end // bs, len(req.block_hashes))
            if full <= st.saved_upto:
                continue
            try:
                ids = self._kv_cache_manager.get_block_ids(rid)[0]
            except Exception:
                continue
            a, b = st.saved_upto, min(full, len(ids))
            if b <= a:
                continue
            hs = [_kh(h) for h in req.block_hashes[a:b]]
            parent = _kh(req.block_hashes[a - 1]) if a > 0 else None
            toks = list(req.all_token_ids[a * bs:b * bs])
            try:
                ev = _event_meta(req, a, b, bs)
            except Exception as e:   # vLLM's internals moved: events without them
                if not getattr(self, "_meta_warned", False):
                    log.warning("kvcached: no LoRA/extra keys for KV events (%s)", e)
                    self._meta_warned = True
                ev = (None, None, None)
            meta.saves.append(_Save(rid, hs, parent, list(ids[a:b]), toks, *ev))
            st.saved_upto = b
        return meta

    def update_connector_output(self, connector_output) -> None:
        wm = getattr(connector_output, "kv_connector_worker_meta", None)
        if isinstance(wm, KvcachedWorkerMetadata):
            for rid in wm.loaded:
                st = self._reqs.get(rid)
                if st is not None:
                    st.loading = False
                    self._release_held(st)

    def request_finished(self, request, block_ids) -> Tuple[bool, Optional[dict]]:
        st = self._reqs.pop(request.request_id, None)
        if st is not None:
            self._take_lookup(st)
            self._release_held(st)
            self._drop_lookup(st)
        self._pending_loads = [x for x in self._pending_loads
                               if x.req_id != request.request_id]
        return False, None

    def get_kv_connector_stats(self):
        if self.stats.is_empty():
            return None
        s, self.stats = self.stats, KvcachedConnectorStats()
        return s

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return KvcachedConnectorStats(data=dict(data or {}))

    def held_references(self) -> int:
        """References the scheduler side holds now (tests, debugging)."""
        return sum(len(st.held) for st in self._reqs.values())

    def drain(self) -> None:
        """Waits until the ops thread has done everything queued so far."""
        if self.is_scheduler:
            self._ops.submit(lambda: None).result()

    # ================= worker side =================

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        names = [n for n in self.spec.layer_names if n in kv_caches]
        missing = [n for n in self.spec.layer_names if n not in kv_caches]
        if missing:
            raise ValueError(f"KvcachedConnector: no KV tensor for layers {missing}")
        nb = self._kv_cache_config.num_blocks
        layers = [analyze_layer(n, kv_caches[n], nb) for n in names]
        layout = BlockLayout(layers)
        if layout.block_bytes != self.spec.block_bytes:
            raise ValueError(f"KvcachedConnector: the KV tensors hold {layout.block_bytes} bytes "
                             f"a block, the KV cache spec says {self.spec.block_bytes}")
        if self.spec.order is not None and layout.order != self.spec.order:
            raise ValueError(f"KvcachedConnector: the KV tensors' layout ({layout.order}) is not "
                             f"the one vLLM resolved ({self.spec.order})")
        self.layout = layout
        self.copier = make_copier(layout, str(self.extra.get("copy_engine", "auto")))
        self.client = _Client(self.extra, self.spec, layout.order, "worker")
        self.client.get()
        log.info("kvcached: %d layers, %d bytes a block, %s copies", len(layers),
                 layout.block_bytes, self.copier.name)

    def unregister_kv_caches(self) -> None:
        self.layout = None

    def restore_kv_caches(self) -> None:
        pass

    def start_load_kv(self, forward_context, **kwargs) -> None:
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if not isinstance(meta, KvcachedConnectorMetadata) or not meta.loads:
            return
        if self.layout is None:
            for ld in meta.loads:
                self._loaded.add(ld.req_id)
                self._load_errors.update(ld.block_ids)
            return
        t0 = time.perf_counter()
        ptrs: List[int] = []
        ids: List[int] = []
        for ld in meta.loads:
            self._loaded.add(ld.req_id)
            got = self._lookup_for_load(ld)
            for i, b in enumerate(ld.block_ids):
                if i < len(got):
                    ptrs.append(got[i][1])
                    ids.append(b)
                else:
                    self._load_errors.add(b)
        if not ptrs:
            self._release_load_hold()
            return
        try:
            nbytes = self.copier.copy_all(ptrs, ids, to_kv=False)
            self.copier.sync()   # the blocks may be released after this
            self.stats.add("loaded_blocks", len(ids))
            self.stats.add("loaded_bytes", nbytes)
        except Exception as e:
            log.warning("kvcached: load failed (%s); vLLM recomputes those blocks", e)
            self._load_errors.update(ids)
        finally:
            self._release_load_hold()
            self.stats.add("load_seconds", time.perf_counter() - t0)

    def _backend_ok(self, c, ptr: int) -> bool:
        """Whether kvcached's blocks are memory this worker's copier can
        reach: device memory for CUDA KV tensors, host memory for CPU ones
        (checked once a connection)."""
        key = (id(c), c.restarts)
        if getattr(self, "_ptr_checked", None) == key:
            return self._ptr_ok
        dev = kvcache._is_device_pointer(ptr)
        self._ptr_ok = dev == self.layout.is_cuda
        self._ptr_checked = key
        if not self._ptr_ok:
            log.error("kvcached: the daemon's blocks are %s memory but vLLM's KV cache is on %s: "
                      "run kvcached with --backend %s; going on without it",
                      "device" if dev else "host", self.layout.device,
                      "cuda" if self.layout.is_cuda else "host")
        return self._ptr_ok

    def _lookup_for_load(self, ld: _Load) -> List[Tuple[int, int]]:
        """The (block, address) pairs of the loadable head of ld's chain,
        referenced on this worker's connection."""
        c = self.client.get() if self.client else None
        if c is None:
            return []
        try:
            blocks = c.lookup(self.client.pool, ld.hashes)
        except kvcache.KvError as e:
            log.debug("kvcached: load lookup failed: %s", e)
            return []
        out = []
        try:
            for b in blocks:
                out.append((b, c.block_ptr(b)))
        except kvcache.KvError:
            pass
        self._load_hold.extend(blocks)
        if out and not self._backend_ok(c, out[0][1]):
            out = []
        self._load_epoch = c.restarts
        return out[:len(ld.block_ids)]

    def _release_load_hold(self) -> None:
        c = self.client.conn if self.client else None
        held, self._load_hold = self._load_hold, []
        if c is None or not held or c.restarts != getattr(self, "_load_epoch", -1):
            return
        try:
            c.release(held)
        except kvcache.KvError as e:
            log.debug("kvcached: release failed: %s", e)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # start_load_kv issued every layer's copy before the forward, on the
        # stream the forward runs on.
        return

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        # Saves copy all layers in wait_for_save: one batch per layer for all
        # of the step's blocks.
        return

    def wait_for_save(self) -> None:
        if not self.has_connector_metadata() or self.layout is None:
            return
        meta = self._get_connector_metadata()
        if not isinstance(meta, KvcachedConnectorMetadata) or not meta.saves:
            return
        n = sum(len(s.hashes) for s in meta.saves)
        c = self.client.get()
        if c is None:
            self.stats.add("save_failures", n)
            return
        t0 = time.perf_counter()
        try:
            blocks = c.alloc(self.client.pool, n)
        except kvcache.KvError as e:
            log.debug("kvcached: save skipped: %s", e)
            self.stats.add("save_failures", n)
            return
        epoch = c.restarts
        held = list(blocks)
        try:
            ptrs = [c.block_ptr(b) for b in blocks]
            if not self._backend_ok(c, ptrs[0]):
                raise ValueError("kvcached's backend does not match the KV cache's device")
            ids = [b for s in meta.saves for b in s.block_ids]
            nbytes = self.copier.copy_all(ptrs, ids, to_kv=True)
            self.copier.sync()
            i = 0
            saved = 0
            for s in meta.saves:
                k = len(s.hashes)
                mine = blocks[i:i + k]
                i += k
                out = self._seal(c, mine, s)
                # The sealed (or deduplicated) blocks replace ours one for one.
                for b in mine:
                    held.remove(b)
                held.extend(out)
                saved += k
            self.stats.add("saved_blocks", saved)
            self.stats.add("saved_bytes", nbytes * saved // max(n, 1))
        except (kvcache.KvError, ValueError) as e:
            log.debug("kvcached: save failed: %s", e)
            self.stats.add("save_failures", n)
        finally:
            if held and c.restarts == epoch:
                try:
                    c.release(held)
                except kvcache.KvError:
                    pass
            self.stats.add("save_seconds", time.perf_counter() - t0)

    def _seal(self, c, blocks: List[int], s: _Save) -> List[int]:
        """Seals with what the events should say of the blocks; a daemon
        that refuses the LoRA or the extra keys (past its bounds: a long
        cache salt, many multimodal items) gets the seal without them."""
        kw = dict(token_ids=s.token_ids, parent=s.parent)
        if s.lora_name is None and s.lora_id is None and s.extra_keys is None:
            return c.seal(self.client.pool, blocks, s.hashes, **kw)
        try:
            return c.seal(self.client.pool, blocks, s.hashes, lora_name=s.lora_name,
                          lora_id=s.lora_id, extra_keys=s.extra_keys, **kw)
        except (kvcache.KvError, TypeError) as e:
            if isinstance(e, kvcache.KvError) and e.code != kvcache.EINVAL:
                raise
            log.debug("kvcached: sealing without the events' LoRA/extra keys: %s", e)
            return c.seal(self.client.pool, blocks, s.hashes, **kw)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        if self.is_scheduler:
            return set()
        e, self._load_errors = self._load_errors, set()
        if e:
            self.stats.add("load_errors", len(e))
        return e

    def build_connector_worker_meta(self):
        if self.is_scheduler or not self._loaded:
            return None
        m, self._loaded = KvcachedWorkerMetadata(set(self._loaded)), set()
        return m

    def shutdown(self) -> None:
        if self.is_scheduler:
            for st in list(self._reqs.values()):
                self._release_held(st)
                self._drop_lookup(st)
            self._ops.submit(self.client.close)
            self._ops.shutdown(wait=True)
        elif self.client is not None:
            self._release_load_hold()
            self.client.close()
