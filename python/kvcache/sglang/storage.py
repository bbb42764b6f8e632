"""KvcachedStorage: SGLang's HiCache storage backend (HiCacheStorage) over
kvcached (docs/sglang.md).

SGLang's HybridCacheController calls a storage backend from two threads of
its own: the prefetch thread (``batch_exists`` for the hit query, then
``batch_get_v1``/``batch_get`` into pages of its host pool) and the backup
thread (``batch_set_v1``/``batch_set`` from pages of its host pool). Each
thread gets its own kvcached connection (a Connection serializes its calls),
made lazily and again after a failed connect, at most once per ``retry_s``.

A page is one kvcached block of the pool of this model, layout and shard
(kvcache.sglang.identity), sealed under the page key's 32 bytes:

- set: look the chain up (pages already there are not copied again), alloc
  blocks for the rest, copy each page's pieces (``get_page_buffer_meta``:
  one per page in page_first layouts, K and V per layer in layer_first) into
  its block, seal, release. kvcached then holds the pages in its prefix cache
  (G1, and its host, disk and cluster tiers behind it) for every instance of
  the same pool identity.
- get: look the chain up (a reference on each page found), copy each block
  into the host pool's pages, release; a page whose bytes may have come from
  a daemon that restarted mid-copy (``Connection.restarts`` moved) is a miss.
- exists: look up and release at once.

Failures never fail a request: with kvcached down, restarting, full or
refusing, exists finds nothing, a get reports its pages as misses and a set
as not stored; SGLang recomputes. Every call has a deadline where the binding
has one (``Connection.set_timeout``). References are taken only by lookup,
alloc and seal, and released before the call returns (or dropped by the
daemon with a connection that broke).
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import sglang

from . import SUPPORTED_SGLANG


def _check_version() -> None:
    v = getattr(sglang, "__version__", "?")
    if os.environ.get("KVCACHE_SGLANG_ANY_VERSION") == "1":
        return
    if not any(v == s or v.startswith(s + ".") for s in SUPPORTED_SGLANG):
        raise ImportError(
            f"kvcache.sglang: SGLang {v} is not supported (this backend supports SGLang "
            f"{', '.join(SUPPORTED_SGLANG)}: its HiCache storage API and host pools). "
            "Install a supported SGLang, or set KVCACHE_SGLANG_ANY_VERSION=1 to try anyway.")


_check_version()

import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo)

import kvcache  # noqa: E402

from .identity import dtype_name, page_key, pool_identity  # noqa: E402
from .identity import _GEOMETRY  # noqa: E402

log = logging.getLogger("kvcache.sglang")

_MIN_BLOCK = 4096

_COUNTERS = ("exists_calls", "exists_hit_pages", "get_pages", "get_hit_pages",
             "get_failed_pages", "set_pages", "set_stored_pages", "set_present_pages",
             "set_failed_pages", "get_bytes", "set_bytes", "get_seconds", "set_seconds",
             "daemon_errors")


def _cfg_dict(cfg) -> Dict[str, Any]:
    if cfg is None:
        return {}
    if isinstance(cfg, dict):
        return dict(cfg)
    return {k: getattr(cfg, k) for k in getattr(cfg, "__dataclass_fields__", {})}


def _host_dict(pool) -> Dict[str, Any]:
    d = {"class": type(pool).__name__, "layout": getattr(pool, "layout", ""),
         "page_size": int(getattr(pool, "page_size", 0)), "dtype": getattr(pool, "dtype", "")}
    for k in _GEOMETRY:
        v = getattr(pool, k, None)
        if isinstance(v, (bool, int)):
            d[k] = v
    return d


def _is_device(ptr: int) -> bool:
    # kvcache's own test (the binding's view() uses it): a CUDA device address
    # on the cuda backend, host memory otherwise.
    return kvcache._is_device_pointer(ptr)


class _Conn:
    """One thread's kvcached connection and the pool registered on it."""

    def __init__(self, owner: "KvcachedStorage"):
        self.owner = owner
        self.conn: Optional[kvcache.Connection] = None
        self.pools: Dict[str, Any] = {}      # format -> kvcache.Pool
        self.next_try = 0.0
        self.device: Optional[bool] = None   # blocks are CUDA memory (cuda backend)

    def get(self, fmt: str):
        """(connection, pool) or None while kvcached cannot be used."""
        o = self.owner
        if self.conn is not None and fmt in self.pools:
            return self.conn, self.pools[fmt]
        now = time.monotonic()
        if now < self.next_try:
            return None
        self.next_try = now + o.retry_s
        c = self.conn
        try:
            if c is None:
                c = _connect(o.socket, o.namespace, o.client_name, o.timeout_ms)
            spec = o._spec(fmt)
            if spec is None:
                return None
            name, lay, block_bytes, _ = spec
            p = c.register_pool(name, block_bytes, o.page_size, dtype=o.dtype_name,
                                layout=lay, model=o.model)
            self.conn = c
            self.pools[fmt] = p
            with o._lock:
                o._conns.add(self)
            o._up(f"connected as {o.client_name}, pool {name} ({block_bytes} bytes a page)")
            return c, p
        except (kvcache.KvError, OSError) as e:
            if c is not None and self.conn is None:
                c.close()
            o._down(e)
            return None

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None
            self.pools.clear()


def _connect(sock, ns, name, timeout_ms):
    """kvcache.connect with a deadline where the binding has one."""
    if timeout_ms:
        try:
            c = kvcache.connect(sock, ns, name, timeout_ms=timeout_ms)
        except TypeError:   # a binding without deadlines
            c = kvcache.connect(sock, ns, name)
    else:
        c = kvcache.connect(sock, ns, name)
    if timeout_ms and hasattr(c, "set_timeout"):
        c.set_timeout(timeout_ms)
    return c


class KvcachedStorage(HiCacheStorage):
    """SGLang's HiCache storage backend over kvcached. The dynamic backend's
    extra config (``--hicache-storage-backend-extra-config``), besides
    ``backend_name``, ``module_path``, ``class_name`` and ``interface_v1``:

    - ``socket``: the daemon's socket (default: $KVCACHED_SOCKET, else
      kvcached's default path);
    - ``namespace``: the kvcached namespace (tenant) to open (default: the
      uid's own); instances share pages only within one namespace;
    - ``model``: the name instances share a pool under (default: SGLang's
      model path) - instances serving the same weights under different
      paths set the same value, different weights never the same;
    - ``timeout_ms`` (default 2000): the deadline of each call to kvcached
      (where the binding has deadlines);
    - ``retry_s`` (default 1): how often to retry a daemon that is down.
    """

    def __init__(self, storage_config: Optional[HiCacheStorageConfig] = None,
                 kwargs: Optional[dict] = None):
        self.storage_config = storage_config
        self.cfg = _cfg_dict(storage_config)
        ex = dict(self.cfg.get("extra_config") or {})
        self.extra = ex
        self.socket = ex.get("socket") or None
        self.namespace = ex.get("namespace") or None
        self.model = str(ex.get("model") or self.cfg.get("model_name") or "")
        if not self.model:
            raise ValueError("kvcache.sglang: no model name (SGLang's model_name, or "
                             "\"model\" in the extra config): pages of different models "
                             "must never share a pool")
        self.timeout_ms = int(ex.get("timeout_ms", 2000))
        self.retry_s = float(ex.get("retry_s", 1.0))
        self.client_name = "sglang-tp%d-%d" % (int(self.cfg.get("tp_rank", 0)), os.getpid())
        self.is_writer = bool(getattr(storage_config, "is_storage_writer", True))
        self.mem_pool_host = None
        self.page_size = 0
        self.dtype_name = ""
        self._specs: Dict[str, Tuple[str, bytes, int, int]] = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns: set = set()
        self._closed = False
        self._is_down = False
        self.counters: Dict[str, float] = {k: 0 for k in _COUNTERS}
        # SGLang's StorageMetrics, drained by get_stats().
        self._prefetch_pgs: List[int] = []
        self._backup_pgs: List[int] = []
        self._prefetch_bw: List[float] = []
        self._backup_bw: List[float] = []

    # -- setup --

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        self.page_size = int(mem_pool_host.page_size)
        self.dtype_name = dtype_name(mem_pool_host.dtype)
        self._specs.clear()
        log.info("kvcache.sglang: host pool %s, layout %s, %d tokens a page; model %s, "
                 "namespace %s", type(mem_pool_host).__name__, mem_pool_host.layout,
                 self.page_size, self.model, self.namespace or "(the uid's own)")

    def _spec(self, fmt: str) -> Optional[Tuple[str, bytes, int, int]]:
        """(pool name, layout bytes, block bytes, page bytes) of this host pool
        for a page format: "v1" (get_page_buffer_meta's pieces) or "flat"."""
        if fmt in self._specs:
            return self._specs[fmt]
        hp = self.mem_pool_host
        if hp is None:
            log.warning("kvcache.sglang: no host pool registered yet")
            return None
        if fmt == "v1":
            idx = torch.arange(0, self.page_size, dtype=torch.int64)
            _, sizes = hp.get_page_buffer_meta(idx)
            pieces = tuple(int(s) for s in sizes)
        else:
            t = hp.get_dummy_flat_data_page()
            pieces = (t.numel() * t.element_size(),)
        name, lay = pool_identity(self.cfg, _host_dict(hp), fmt, pieces, self.model)
        # kvcached's blocks are multiples of 256 bytes from 4 KiB: a small
        # page takes a block padded past its bytes (never read back).
        page = sum(pieces)
        self._specs[fmt] = (name, lay, max(_MIN_BLOCK, -(-page // 256) * 256), page)
        return self._specs[fmt]

    def _client(self, fmt: str):
        if self._closed:
            return None
        c = getattr(self._local, "c", None)
        if c is None:
            c = self._local.c = _Conn(self)
        return c.get(fmt)

    def _up(self, what: str) -> None:
        if self._is_down:
            log.warning("kvcache.sglang: kvcached is back: %s", what)
        else:
            log.info("kvcache.sglang: %s", what)
        self._is_down = False

    def _down(self, e) -> None:
        self.counters["daemon_errors"] += 1
        if not self._is_down:
            log.warning("kvcache.sglang: cannot use kvcached (%s); SGLang recomputes what "
                        "it would have loaded, retrying every %gs", e, self.retry_s)
            self._is_down = True
        else:
            log.debug("kvcache.sglang: kvcached still unusable: %s", e)

    # -- the pages --

    def _v1_pieces(self, host_indices: torch.Tensor, n: int):
        """Per page, its pieces in the host pool: [[(ptr, size), ...], ...]."""
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices[:n * self.page_size])
        if n == 0:
            return []
        per = len(ptrs) // n
        return [list(zip(ptrs[i * per:(i + 1) * per], sizes[i * per:(i + 1) * per]))
                for i in range(n)]

    def _lookup(self, conn, pool, hashes: List[bytes]) -> Tuple[List[int], int]:
        """The cached prefix of hashes, each block referenced, and the epoch
        (Connection.restarts) they belong to: read after the call, which may
        itself have reconnected to a restarted daemon before it took them."""
        try:
            blocks = conn.lookup(pool, hashes)
            return blocks, conn.restarts
        except kvcache.KvError as e:
            self._down(e)
            return [], conn.restarts

    def _release(self, conn, blocks: List[int], epoch: int) -> None:
        """Drops the references on blocks taken in epoch; a restart since
        dropped them with the old daemon."""
        if not blocks or conn.restarts != epoch:
            return   # a restart dropped them with the old daemon
        try:
            conn.release(blocks)
        except kvcache.KvError as e:
            log.debug("kvcache.sglang: release failed: %s", e)

    def _copy(self, dst: int, src: int, n: int, to_block: bool, device: bool) -> None:
        if not device:
            ctypes.memmove(dst, src, n)
            return
        # cuda backend: the block is GPU memory (docs/sglang.md says why the
        # host backend is the placement with the fewest copies).
        hbuf = torch.frombuffer((ctypes.c_uint8 * n).from_address(src if to_block else dst),
                                dtype=torch.uint8)
        dev = torch.as_tensor(kvcache.CudaBlock(None, dst if to_block else src, (n,), "|u1"),
                              device="cuda")
        if to_block:
            dev.copy_(hbuf)
        else:
            hbuf.copy_(dev)

    def _get_pages(self, fmt: str, keys: List[str], dsts: List[List[Tuple[int, int]]]
                   ) -> List[bool]:
        """Copies the cached prefix of keys into dsts (per page its pieces);
        True for each page copied."""
        n = len(keys)
        ok = [False] * n
        self.counters["get_pages"] += n
        if n == 0:
            return ok
        cl = self._client(fmt)
        if cl is None:
            self.counters["get_failed_pages"] += n
            return ok
        conn, pool = cl
        t0 = time.perf_counter()
        blocks, epoch = self._lookup(conn, pool, [page_key(k) for k in keys])
        nbytes = 0
        try:
            for i, b in enumerate(blocks):
                if epoch != conn.restarts:
                    break
                try:
                    src = conn.block_ptr(b)
                except kvcache.KvError:
                    break
                dev = _is_device(src)
                off = 0
                for ptr, size in dsts[i]:
                    self._copy(ptr, src + off, size, False, dev)
                    off += size
                ok[i] = True
                nbytes += off
            if epoch != conn.restarts:
                # The daemon went away while we copied: what was mapped reads
                # as zeros (kvcache.h), so no page of this call is trusted.
                ok = [False] * n
                nbytes = 0
        finally:
            self._release(conn, blocks, epoch)
        dt = time.perf_counter() - t0
        hits = sum(ok)
        c = self.counters
        c["get_hit_pages"] += hits
        c["get_failed_pages"] += n - hits
        c["get_bytes"] += nbytes
        c["get_seconds"] += dt
        if hits:
            self._prefetch_pgs.append(hits)
            self._prefetch_bw.append(nbytes / dt / 1e9 if dt > 0 else 0.0)
        return ok

    def _set_pages(self, fmt: str, keys: List[str], srcs: List[List[Tuple[int, int]]]
                   ) -> List[bool]:
        """Stores pages (per page its pieces) under keys; True for each page
        kvcached now holds."""
        n = len(keys)
        self.counters["set_pages"] += n
        if n == 0:
            return []
        cl = self._client(fmt)
        if cl is None:
            self.counters["set_failed_pages"] += n
            return [False] * n
        conn, pool = cl
        t0 = time.perf_counter()
        hashes = [page_key(k) for k in keys]
        ok = [False] * n
        # Pages already cached (this chain's head, usually) are not copied.
        have, epoch = self._lookup(conn, pool, hashes)
        self._release(conn, have, epoch)
        for i in range(len(have)):
            ok[i] = True
        todo = [i for i in range(len(have), n)]
        self.counters["set_present_pages"] += len(have)
        nbytes = 0
        blocks: List[int] = []
        try:
            if todo:
                blocks = conn.alloc(pool, len(todo))
                epoch = conn.restarts
                for j, i in enumerate(todo):
                    dst = conn.block_ptr(blocks[j])
                    dev = _is_device(dst)
                    off = 0
                    for ptr, size in srcs[i]:
                        self._copy(dst + off, ptr, size, True, dev)
                        off += size
                    nbytes += off
                held = conn.seal(pool, blocks, [hashes[i] for i in todo])
                blocks = []
                self._release(conn, held, conn.restarts)
                for i in todo:
                    ok[i] = True
        except kvcache.KvError as e:
            if e.code in (kvcache.ENOSPC, kvcache.EQUOTA):
                log.debug("kvcache.sglang: no room for %d pages: %s", len(todo), e)
            else:
                self._down(e)
            self._release(conn, blocks, epoch)
            nbytes = 0
        dt = time.perf_counter() - t0
        stored = sum(ok)
        c = self.counters
        c["set_stored_pages"] += stored
        c["set_failed_pages"] += n - stored
        c["set_bytes"] += nbytes
        c["set_seconds"] += dt
        if nbytes:
            # Pages copied in (not those kvcached already had).
            self._backup_pgs.append(len(todo))
            self._backup_bw.append(nbytes / dt / 1e9 if dt > 0 else 0.0)
        return ok

    def _exists(self, keys: List[str], fmt: str) -> int:
        self.counters["exists_calls"] += 1
        if not keys:
            return 0
        cl = self._client(fmt)
        if cl is None:
            return 0
        conn, pool = cl
        blocks, epoch = self._lookup(conn, pool, [page_key(k) for k in keys])
        self._release(conn, blocks, epoch)
        self.counters["exists_hit_pages"] += len(blocks)
        return len(blocks)

    def _fmt(self) -> str:
        """The page format the controller uses: v1 with ``interface_v1``."""
        return "v1" if self.extra.get("interface_v1") else "flat"

    # -- v1: zero-copy against the host pool --

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        return self._exists(list(keys), self._fmt())

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        keys = list(keys)
        if self.mem_pool_host is None or host_indices.numel() < len(keys) * self.page_size:
            log.error("kvcache.sglang: batch_get_v1: %d keys and %d host slots",
                      len(keys), host_indices.numel())
            return [False] * len(keys)
        return self._get_pages("v1", keys, self._v1_pieces(host_indices, len(keys)))

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        keys = list(keys)
        if not self.is_writer:
            # MLA pages are the same on every TP rank: one rank writes them.
            return [True] * len(keys)
        if self.mem_pool_host is None or host_indices.numel() < len(keys) * self.page_size:
            log.error("kvcache.sglang: batch_set_v1: %d keys and %d host slots",
                      len(keys), host_indices.numel())
            return [False] * len(keys)
        return self._set_pages("v1", keys, self._v1_pieces(host_indices, len(keys)))

    # -- the older calls: SGLang's flat data pages --

    def _flat_spec_bytes(self) -> int:
        s = self._spec("flat")
        return s[3] if s else -1

    def _tensor_piece(self, t: Optional[torch.Tensor]):
        if t is None or t.device.type != "cpu" or not t.is_contiguous():
            return None
        n = t.numel() * t.element_size()
        if n != self._flat_spec_bytes():
            return None
        return [(t.data_ptr(), n)]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Optional[torch.Tensor]]:
        keys = list(keys)
        if target_locations is None:
            if self.mem_pool_host is None:
                return [None] * len(keys)
            target_locations = [self.mem_pool_host.get_dummy_flat_data_page() for _ in keys]
        tl = list(target_locations)
        pieces = [self._tensor_piece(t) for t in tl]
        n = next((i for i, p in enumerate(pieces) if p is None), len(keys))
        if n < len(keys):
            log.error("kvcache.sglang: batch_get: target %d is not a contiguous CPU page of "
                      "this host pool", n)
        ok = self._get_pages("flat", keys[:n], pieces[:n]) + [False] * (len(keys) - n)
        return [t if o else None for t, o in zip(tl, ok)]

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Optional[torch.Tensor]:
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        keys = list(keys)
        if not self.is_writer:
            return True
        vals = [None if v is None else v.contiguous() for v in (values or [])]
        if len(vals) != len(keys):
            return False
        pieces = [self._tensor_piece(v) for v in vals]
        if any(p is None for p in pieces):
            log.error("kvcache.sglang: batch_set: a value is not a CPU page of this host pool")
            return False
        return all(self._set_pages("flat", keys, pieces))

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def exists(self, key: str) -> bool:
        return self._exists([key], self._fmt()) == 1

    # -- the rest of the API --

    def clear(self) -> bool:
        # kvcached evicts by LRU; pages of one tenant are not dropped on one
        # instance's request (another instance may be reading them).
        log.info("kvcache.sglang: clear: kvcached keeps the pages (LRU eviction; "
                 "`kvctl evict` drops them)")
        return False

    def get_stats(self):
        """SGLang's StorageMetrics since the last call (pages per get and set
        call, their GB/s); SGLang logs them with --enable-cache-report /
        storage metrics on."""
        from sglang.srt.observability.metrics_collector import StorageMetrics
        m = StorageMetrics()
        m.prefetch_pgs.extend(self._prefetch_pgs)
        m.backup_pgs.extend(self._backup_pgs)
        m.prefetch_bandwidth.extend(self._prefetch_bw)
        m.backup_bandwidth.extend(self._backup_bw)
        for lst in (self._prefetch_pgs, self._backup_pgs, self._prefetch_bw, self._backup_bw):
            lst.clear()
        return m

    def close(self) -> None:
        """Closes every connection (SGLang calls it on detach); the daemon
        drops whatever they held. Idempotent."""
        self._closed = True
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            c.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


__all__ = ["KvcachedStorage"]
