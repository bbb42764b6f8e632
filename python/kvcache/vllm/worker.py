"""The connector's worker side (one per GPU worker): registers the pool
of this model, layout and TP rank from vLLM's per-layer KV views
(kvcache.vllm.datapath), loads blocks into vLLM's KV cache before the
forward and saves full blocks after it.

``start_load_kv`` looks the hashes up again on its own connection (taking
its own references, mapping the blocks), copies every layer in one batch
per layer, and reports the blocks it could not load through
``get_block_ids_with_load_errors`` (vLLM recomputes them); ``wait_for_save``
allocates, copies out, seals with vLLM's hashes and token ids, and
releases.

Loads the scheduler marked asynchronous (hits kvcached had outside its
device pool) run on a thread of the worker's own ("kvcached-load", with a
copier of its own) while vLLM runs other requests' forwards; vLLM holds the
request in WAITING_FOR_REMOTE_KVS until ``get_finished`` reports it in
finished_recving, with its failed blocks in
``get_block_ids_with_load_errors`` of the same step.

Several KV cache groups (vLLM's hybrid allocator): each group's layers
form their own block layout, copier and kvcached pool; a load names each
group's hashes and block ids (only the blocks vLLM holds), always runs
asynchronously, and a load that misses any block of any group fails the
request's load as a whole (failed_recving: vLLM 0.33 cannot take per-block
errors from a hybrid model). Saves go to their group's pool.

Threads: everything else runs on the worker's thread. The connection is
shared with the load thread (the library serializes calls on it, each
within its deadline).
"""
from __future__ import annotations

import logging
import time
import concurrent.futures as _fut
from typing import Any, Dict, List, Optional, Set, Tuple

import kvcache

from .client import Client
from .datapath import BlockLayout, analyze_layer, make_copier
from .identity import PoolSpec
from .metadata import (KvcachedConnectorMetadata, KvcachedConnectorStats, KvcachedWorkerMetadata,
                       Load, Save, TokenSlice)

log = logging.getLogger("kvcache.vllm")


class KvcachedWorker:
    """The worker side; ``KvcachedConnector`` hands it vLLM's calls."""

    def __init__(self, extra: dict, specs: List[PoolSpec], num_blocks: int, save_mode: str):
        specs = list(specs) if isinstance(specs, (list, tuple)) else [specs]
        self.extra, self.spec, self.specs = extra, specs[0], specs
        self.layouts: List[BlockLayout] = []
        self.copiers: list = []
        self._acopiers: list = []
        self._failed: Set[str] = set()      # hybrid loads that failed (failed_recving)
        self.num_blocks = num_blocks
        self.save_mode = save_mode
        self.stats = KvcachedConnectorStats()
        self.client: Optional[Client] = None
        self.layout: Optional[BlockLayout] = None
        self.copier = None
        self._load_errors: Set[int] = set()
        self._loaded: Set[str] = set()
        self._load_hold: List[int] = []
        self._async: Optional[_fut.ThreadPoolExecutor] = None
        self._acopier = None
        self._inflight: Dict[str, _fut.Future] = {}
        self._done_now: Set[str] = set()      # async loads that failed at start

    def _group_layout(self, spec: PoolSpec, kv_caches: Dict[str, Any]) -> BlockLayout:
        names = [n for n in spec.layer_names if n in kv_caches]
        missing = [n for n in spec.layer_names if n not in kv_caches]
        if missing:
            raise ValueError(f"KvcachedConnector: no KV tensor for layers {missing}")
        nb = self.num_blocks
        layers = [analyze_layer(n, kv_caches[n], nb) for n in names]
        layout = BlockLayout(layers)
        if layout.block_bytes != spec.block_bytes:
            raise ValueError(f"KvcachedConnector: the KV tensors hold {layout.block_bytes} bytes "
                             f"a block, the KV cache spec says {spec.block_bytes}")
        if spec.order is not None and layout.order != spec.order:
            raise ValueError(f"KvcachedConnector: the KV tensors' layout ({layout.order}) is not "
                             f"the one vLLM resolved ({spec.order})")
        return layout

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        # Each group's layers alone: in vLLM's hybrid layout a layer of one
        # group and one of another view the same memory, block id b of
        # each meaning another request's block.
        layouts = [self._group_layout(sp, kv_caches) for sp in self.specs]
        engine = str(self.extra.get("copy_engine", "auto"))
        self.layouts = layouts
        self.copiers = [make_copier(ly, engine) for ly in layouts]
        self.layout, self.copier = layouts[0], self.copiers[0]
        self.client = Client(self.extra, self.specs, [ly.order for ly in layouts], "worker")
        self.client.get()
        log.info("kvcached: %d layers in %d group(s), %s bytes a block, %s copies",
                 sum(len(ly.layers) for ly in layouts), len(layouts),
                 "/".join(str(ly.block_bytes) for ly in layouts), self.copier.name)

    def unregister_kv_caches(self) -> None:
        # Not reached in an engine (supports_sleep_mode is False); kept so
        # that a call stops the copies rather than leave them on freed
        # memory, and restore_kv_caches takes them up again.
        if self.layout is not None:
            self._parked = self.layout
        self.layout = None

    def restore_kv_caches(self) -> None:
        if self.layout is None and getattr(self, "_parked", None) is not None:
            self.layout, self._parked = self._parked, None

    def start_load_kv(self, meta) -> None:
        if not isinstance(meta, KvcachedConnectorMetadata) or not meta.loads:
            return
        if self.layout is None:
            for ld in meta.loads:
                self._load_errors.update(ld.block_ids)
                if ld.groups is not None:
                    self._failed.add(ld.req_id)
                if ld.async_:
                    self._done_now.add(ld.req_id)
                else:
                    self._loaded.add(ld.req_id)
            return
        sync = []
        for ld in meta.loads:
            if not ld.async_:
                sync.append(ld)
                continue
            if self._async is None:
                self._async = _fut.ThreadPoolExecutor(1, thread_name_prefix="kvcached-load")
                engine = str(self.extra.get("copy_engine", "auto"))
                self._acopiers = [make_copier(ly, engine) for ly in self.layouts]
                self._acopier = self._acopiers[0]
            fn = self._load_groups_async if ld.groups is not None else self._load_async
            self._inflight[ld.req_id] = self._async.submit(fn, ld)
        if not sync:
            return
        t0 = time.perf_counter()
        ptrs: List[int] = []
        ids: List[int] = []
        for ld in sync:
            self._loaded.add(ld.req_id)
            got, epoch = self._lookup_for_load(ld, self._load_hold)
            if epoch >= 0:
                self._load_epoch = epoch
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

    def _load_async(self, ld: Load):
        """On the load thread: ld's blocks into vLLM's KV cache. Returns
        (block ids not loaded, stats)."""
        t0 = time.perf_counter()
        hold: List[int] = []
        st: Dict[str, float] = {}
        errors: Set[int] = set()
        epoch = -1
        try:
            got, epoch = self._lookup_for_load(ld, hold)
            errors = set(ld.block_ids[len(got):])
            if got:
                ids = ld.block_ids[:len(got)]
                try:
                    nbytes = self._acopier.copy_all([p for _, p in got], ids, to_kv=False)
                    self._acopier.sync()
                    st["loaded_blocks"] = len(ids)
                    st["loaded_bytes"] = nbytes
                except Exception as e:
                    log.warning("kvcached: load failed (%s); vLLM recomputes those blocks", e)
                    errors.update(ids)
        except Exception as e:   # never leave vLLM waiting for a request
            log.warning("kvcached: asynchronous load failed (%s)", e)
            errors = set(ld.block_ids)
        finally:
            self._release(hold, epoch)
            st["load_seconds"] = time.perf_counter() - t0
        return errors, st

    def _load_groups_async(self, ld: Load):
        """On the load thread: a hybrid model's load, group by group into
        that group's layers. Any block not loaded fails the whole load (the
        request is in failed_recving: vLLM recomputes it); returns
        (None or the failure, stats) like _load_async."""
        t0 = time.perf_counter()
        st: Dict[str, float] = {}
        holds: List[Tuple[List[int], int]] = []
        ok = True
        try:
            for g, hashes, ids in ld.groups:
                if not ids:
                    continue
                hold: List[int] = []
                got, epoch = self._lookup_for_load(Load(ld.req_id, hashes, ids), hold, g)
                holds.append((hold, epoch))
                if len(got) < len(ids):
                    ok = False
                    break
                nbytes = self._acopiers[g].copy_all([p for _, p in got], ids, to_kv=False)
                self._acopiers[g].sync()
                st["loaded_blocks"] = st.get("loaded_blocks", 0) + len(ids)
                st["loaded_bytes"] = st.get("loaded_bytes", 0) + nbytes
        except Exception as e:   # never leave vLLM waiting for a request
            log.warning("kvcached: load failed (%s); vLLM recomputes the request", e)
            ok = False
        finally:
            for hold, epoch in holds:
                self._release(hold, epoch)
            st["load_seconds"] = time.perf_counter() - t0
        if not ok:
            st.pop("loaded_blocks", None)
            st.pop("loaded_bytes", None)
            st["load_errors"] = sum(len(ids) for _, _, ids in ld.groups)
        return (None if ok else "failed"), st

    def take_failed_requests(self) -> Set[str]:
        """Hybrid loads that failed since the last call (failed_recving)."""
        f, self._failed = self._failed, set()
        return f

    def get_finished(self, finished_req_ids) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        """(None, the requests whose asynchronous load ended since the
        last call); their failed blocks go to get_block_ids_with_load_errors
        of this step, the scheduler side learns of them through the worker
        metadata (and releases its references)."""
        done = set(self._done_now)
        self._done_now.clear()
        for rid, f in list(self._inflight.items()):
            if not f.done():
                continue
            del self._inflight[rid]
            errors, st = f.result()
            if isinstance(errors, str):
                self._failed.add(rid)         # a hybrid load: the request fails
            elif errors:
                self._load_errors.update(errors)
            for k, v in st.items():
                self.stats.add(k, v)
            done.add(rid)
        self._loaded.update(done)
        return None, (done or None)

    def _release(self, held: List[int], epoch: int) -> None:
        c = self.client.conn if self.client else None
        if c is None or not held or c.restarts != epoch:
            return
        try:
            c.release(held)
        except kvcache.KvError as e:
            self.client.failed(e)

    def _lookup_for_load(self, ld: Load, hold: List[int], group: int = 0
                         ) -> Tuple[List[Tuple[int, int]], int]:
        """The (block, address) pairs of the loadable head of ld's chain
        (in the group's pool), referenced on this worker's connection (the
        references go to hold), and the connection's epoch (-1: none)."""
        c = self.client.get() if self.client else None
        if c is None:
            return [], -1
        pool = self.client.pools[group]
        if not ld.hashes:
            return [], c.restarts
        try:
            blocks = c.lookup(pool, ld.hashes)
        except kvcache.KvError as e:
            self.client.failed(e)
            return [], -1
        self.client.ok()
        out = []
        try:
            for b in blocks:
                out.append((b, c.block_ptr(b)))
        except kvcache.KvError:
            pass
        hold.extend(blocks)
        if out and not self._backend_ok(c, out[0][1]):
            out = []
        return out[:len(ld.block_ids)], c.restarts

    def _release_load_hold(self) -> None:
        c = self.client.conn if self.client else None
        held, self._load_hold = self._load_hold, []
        if c is None or not held or c.restarts != getattr(self, "_load_epoch", -1):
            return
        try:
            c.release(held)
        except kvcache.KvError as e:
            self.client.failed(e)

    def wait_for_save(self, meta) -> None:
        if self.layout is None:
            return
        if not isinstance(meta, KvcachedConnectorMetadata) or not meta.saves:
            return
        by_group: Dict[int, List[Save]] = {}
        for s in meta.saves:
            by_group.setdefault(s.group, []).append(s)
        for g in sorted(by_group):
            self._save_group(g, by_group[g])

    def _save_group(self, g: int, saves: List[Save]) -> None:
        """One group's saves: allocated in its pool, copied from its layers."""
        n = sum(len(s.hashes) for s in saves)
        if not 0 <= g < len(self.copiers):
            self.stats.add("save_failures", n)
            return
        c = self.client.get()
        if c is None:
            self.stats.add("save_failures", n)
            return
        pool, copier = self.client.pools[g], self.copiers[g]
        t0 = time.perf_counter()
        try:
            blocks = c.alloc(pool, n)
        except kvcache.KvError as e:
            self.client.failed(e)
            self.stats.add("save_failures", n)
            return
        self.client.ok()
        epoch = c.restarts
        held = list(blocks)
        try:
            ptrs = [c.block_ptr(b) for b in blocks]
            if not self._backend_ok(c, ptrs[0]):
                raise ValueError("kvcached's backend does not match the KV cache's device")
            ids = [b for s in saves for b in s.block_ids]
            nbytes = copier.copy_all(ptrs, ids, to_kv=True)
            copier.sync()
            i = 0
            saved = 0
            for s in saves:
                k = len(s.hashes)
                mine = blocks[i:i + k]
                i += k
                out = self._seal(c, pool, mine, s)
                # The sealed (or deduplicated) blocks replace ours one for one.
                for b in mine:
                    held.remove(b)
                held.extend(out)
                saved += k
            self.stats.add("saved_blocks", saved)
            self.stats.add("saved_bytes", nbytes * saved // max(n, 1))
        except (kvcache.KvError, ValueError) as e:
            self.client.failed(e)
            self.stats.add("save_failures", n)
        finally:
            if held and c.restarts == epoch:
                try:
                    c.release(held)
                except kvcache.KvError as e:
                    self.client.failed(e)
            self.stats.add("save_seconds", time.perf_counter() - t0)

    def drop_saves(self, meta, exc: BaseException) -> None:
        """The step's forward raised: its blocks are not what the model
        computes, so none is saved (counted as save_failures)."""
        if not isinstance(meta, KvcachedConnectorMetadata) or not meta.saves:
            return
        n = sum(len(s.hashes) for s in meta.saves)
        self.stats.add("save_failures", n)
        log.warning("kvcached: the forward failed (%s: %s); its %d blocks are not saved",
                    type(exc).__name__, exc, n)

    def _seal(self, c, pool, blocks: List[int], s: Save) -> List[int]:
        """Seals with what the events should say of the blocks; a daemon
        that refuses the LoRA or the extra keys (past its bounds: a long
        cache salt, many multimodal items) gets the seal without them."""
        toks = s.token_ids
        kw = dict(token_ids=toks.tolist() if type(toks) is TokenSlice else toks, parent=s.parent)
        if s.lora_name is None and s.lora_id is None and s.extra_keys is None:
            return c.seal(pool, blocks, s.hashes, **kw)
        try:
            return c.seal(pool, blocks, s.hashes, lora_name=s.lora_name,
                          lora_id=s.lora_id, extra_keys=s.extra_keys, **kw)
        except (kvcache.KvError, TypeError) as e:
            if isinstance(e, kvcache.KvError) and e.code != kvcache.EINVAL:
                raise
            log.debug("kvcached: sealing without the events' LoRA/extra keys: %s", e)
            return c.seal(pool, blocks, s.hashes, **kw)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        e, self._load_errors = self._load_errors, set()
        if e:
            self.stats.add("load_errors", len(e))
        return e

    def build_connector_worker_meta(self):
        if not self._loaded:
            return None
        m, self._loaded = KvcachedWorkerMetadata(set(self._loaded)), set()
        return m

    def get_kv_connector_stats(self):
        if self.stats.is_empty():
            return None
        s, self.stats = self.stats, KvcachedConnectorStats()
        return s

    def shutdown(self) -> None:
        if self._async is not None:
            # Each load ends within the connection's deadline.
            self._async.shutdown(wait=True)
        if self.client is not None:
            self._release_load_hold()
            self.client.close()
