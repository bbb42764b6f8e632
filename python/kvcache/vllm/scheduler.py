"""The connector's scheduler side (one per engine): looks requests up in
kvcached, holds the references of what it found until the workers loaded
it, and hands the workers each step's loads and saves.

``get_num_new_matched_tokens`` looks up the request's own ``block_hashes``
beyond vLLM's local hit in kvcached's prefix index, on a thread of its own
(a lookup that waits on a promotion from the host or disk tier answers
``None`` - "ask again" - rather than block the scheduler); the references
the lookup took keep the blocks from eviction until the worker has loaded
them, the request ends, or it is preempted. ``build_connector_meta`` hands
the worker this step's loads (hashes + vLLM block ids) and saves (full
blocks that this step completes, with hashes, parent and token ids).

Several KV cache groups (vLLM's hybrid allocator, ``SupportsHMA``): each
group has its own kvcached pool, and a hit of n blocks is offered only
when every group has what vLLM will hold for it after the hit - a
full-attention group all n blocks, a sliding-window group the blocks its
window reaches from the hit's end (vLLM puts its null block in place of
the others and never reads them). Such loads are always asynchronous:
vLLM 0.33 takes a hybrid model's load failures only per request
(failed_recving), never per block.

Threads: the connection is used only by the one ops thread; every other
method runs on vLLM's scheduler thread.
"""
from __future__ import annotations

import collections
import concurrent.futures as _fut
import logging
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import kvcache

from .client import Client
from .identity import PoolSpec, event_meta, kv_keys, kv_keys_packed
from .metadata import (KvcachedConnectorMetadata, KvcachedConnectorStats, KvcachedWorkerMetadata,
                       Load, Save, TokenSlice)

log = logging.getLogger("kvcache.vllm")

try:   # vLLM 0.33 (v1/metrics/cache_hit_source.py); 0.32 has no hit sources
    from vllm.v1.metrics.cache_hit_source import CacheHitSource as _CHS
    _SOURCES: Optional[Dict[Any, Any]] = {
        kvcache.TIER_G1: _CHS.DEVICE, kvcache.TIER_G2: _CHS.HOST,
        kvcache.TIER_G3: _CHS.DISK, kvcache.TIER_G4: _CHS.P2P,
        None: _CHS.EXTERNAL_UNSPECIFIED}
except ImportError:
    _SOURCES = None


def _unspecified():
    return _SOURCES[None] if _SOURCES is not None else "external_unspecified"


# An empty list of blocks or tiers, shared: ReqState's lists are replaced,
# never changed in place.
_NONE: tuple = ()
_UNSET = object()
# ReqState.keys of a request whose block hashes are their own kvcached keys.
_IDENT: list = []


class ReqState:
    """What the scheduler side keeps of one request (a class with slots: one
    is made for every request vLLM schedules)."""

    __slots__ = ("request", "held", "tiers", "load_tiers", "held_epoch", "lookup", "lookup_i",
                 "taken", "lookup_at", "asked_since", "ext_blocks", "start_block", "saved_upto",
                 "loading", "async_load", "keys", "keys_base", "hit", "load_failed")

    def __init__(self, request):
        self.request = request
        self.held = _NONE            # scheduler refs (lookup)
        self.tiers = _NONE           # kvcache.TIER_* of each held block
        self.load_tiers = _NONE      # of the blocks the last load plan took
        self.held_epoch = 0
        self.lookup: Optional[_Batch] = None   # the lookup's batch; its answer is
        self.lookup_i = 0                       # element lookup_i of the batch's
        self.taken = False           # the answer was moved into held (or given up)
        self.lookup_at = -1          # num_computed_tokens the lookup was for
        self.asked_since = 0.0
        self.ext_blocks = 0          # blocks the last answer offered
        self.start_block = 0         # first block of that answer
        self.saved_upto = 0          # blocks [0, saved_upto) are in kvcached or being saved
        self.loading = False
        self.async_load = False      # the last answer was (n, True)
        self.keys: Optional[List[bytes]] = None   # kvcached keys of blocks [keys_base, ...),
        self.keys_base = 0                        # kept from the lookup for saves and loads
        self.hit = 0                 # several groups: the blocks every group can supply
        self.load_failed = False     # a hybrid load failed: no more hits for it

    def keys_of(self, a: int, b: int) -> List[bytes]:
        """kvcached keys of the request's blocks [a, b)."""
        k, kb = self.keys, self.keys_base
        if k is _IDENT:
            # The request's block hashes are their own keys (checked by the
            # lookup: bytes of 32); the list only grows past its blocks.
            return self.request.block_hashes[a:b]
        if k is None or a < kb or a - kb >= len(k):
            return kv_keys(self.request.block_hashes[a:b])
        have = k[a - kb:b - kb]
        if a + len(have) >= b:
            return have
        # The lookup stopped short of b (it leaves vLLM the last token's
        # block): only the blocks past it are converted.
        return have + kv_keys(self.request.block_hashes[a + len(have):b])


class _Batch:
    """One hand-off to the ops thread: the lookups of up to lookup_batch
    requests. ``res`` is None until the ops thread stores the answers (one
    a request, in order; then ``done`` is set): the scheduler thread reads
    it without a lock, and waits only while it is None. ``orphans``: the
    requests that gave their lookup up before the answer came (the ops
    thread releases what it found for them); under ``lock``, which only
    that hand-over takes."""

    __slots__ = ("res", "done", "lock", "orphans")

    def __init__(self):
        self.res: Optional[list] = None
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.orphans: Optional[List[int]] = None


class KvcachedScheduler:
    """The scheduler side; ``KvcachedConnector`` hands it vLLM's calls."""

    def __init__(self, extra: dict, specs: List[PoolSpec], save_mode: str, loads_on: bool):
        specs = list(specs) if isinstance(specs, (list, tuple)) else [specs]
        spec = specs[0]
        self.extra, self.spec, self.specs = extra, spec, specs
        # Several groups, or a sliding-window one: per-group lookups, loads
        # and saves (vLLM may hold the null block in place of some).
        self.hybrid = len(specs) > 1 or spec.window is not None
        self.block_size = spec.block_size
        self.save_mode, self.loads_on = save_mode, loads_on
        self.stats = KvcachedConnectorStats()
        self._lookup_timeout = float(extra.get("lookup_timeout_ms", 20)) / 1e3
        self._lookup_deadline = float(extra.get("lookup_deadline_ms", 2000)) / 1e3
        self.client = Client(extra, specs, [s.order or "NHC" for s in specs], "scheduler")
        self._ops = _fut.ThreadPoolExecutor(1, thread_name_prefix="kvcached-sched")
        self._reqs: Dict[str, ReqState] = {}
        self.deferred = 0            # lookups answered "ask again" (None), ever
        self._pending_loads: List[Load] = []
        # Requests added and not asked about yet (on_new_request), looked up
        # together with the first one asked: one hand-off to the ops thread
        # for up to lookup_batch requests rather than one each.
        self._unasked: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
        self._batch = max(1, int(extra.get("lookup_batch", 256)))
        # Hits not in kvcached's device pool (promoted from the host or disk
        # tier, fetched from another node) load asynchronously.
        self.async_loads = str(extra.get("async_loads", "tiers"))
        if self.async_loads not in ("tiers", "never"):
            raise ValueError("KvcachedConnector: async_loads %r: \"tiers\" or \"never\""
                             % self.async_loads)
        # Releases wait here for the ops thread, at most one flush queued.
        self._rel_lock = threading.Lock()
        self._rel: List[Tuple[List[int], int]] = []
        self._rel_queued = False
        # Connected on the ops thread while vLLM starts, not by the first
        # request's lookup (a daemon that is down is tried again then).
        self._ops.submit(self.client.get)

    def on_new_request(self, request) -> None:
        if self.loads_on:
            self._unasked[request.request_id] = request

    def _op_batch(self, batch: _Batch, chains: list, starts: List[int]) -> None:
        """On the ops thread: a batch's lookups; the answers go into the
        batch, and what the orphans' lookups found is released."""
        try:
            res = self._op_lookup_many(chains, starts)
        except Exception as e:      # never a request's failure: a miss
            log.warning("kvcached: a batch of %d lookups failed: %s", len(chains), e)
            res = [None] * len(chains)
        with batch.lock:
            batch.res = res
            orphans, batch.orphans = batch.orphans, None
        batch.done.set()
        for i in orphans or ():
            r = res[i]
            if r:
                self._queue_release(r[0], r[1])

    def _op_lookup_many(self, chains: list, starts: List[int]):
        """On the ops thread: _op_lookup of each chain, in order. One group:
        the chains (each its keys concatenated, kv_keys_packed) in one
        pipelined call (Connection.lookup_many)."""
        if self.hybrid:
            return [self._op_lookup(h, a) for h, a in zip(chains, starts)]
        c = self.client.get()
        if c is None:
            return [None] * len(chains)
        try:
            res = c.lookup_many(self.client.pool, chains, tiers=True)
        except kvcache.KvError as e:
            self.client.failed(e)
            return [None] * len(chains)
        self.client.ok()
        epoch = c.restarts
        # Misses (most lookups of new prompts) share one answer: fewer
        # objects for the cyclic GC to walk.
        miss = (_NONE, epoch, _NONE)
        return [(b, epoch, t) if b else miss for b, t in res]

    def _op_lookup(self, hashes: List[bytes], start: int = 0):
        """On the ops thread: (blocks, epoch, tiers) or None (no daemon);
        several groups: (blocks, epoch, tiers, hit) (_op_lookup_groups)."""
        c = self.client.get()
        if c is None:
            return None
        if self.hybrid:
            return self._op_lookup_groups(c, hashes, start)
        try:
            blocks, tiers = c.lookup(self.client.pool, hashes, tiers=True)
        except kvcache.KvError as e:
            self.client.failed(e)
            return None
        self.client.ok()
        return blocks, c.restarts, tiers

    def _swa_first(self, spec: PoolSpec, end: int) -> int:
        """The first block a sliding-window group holds once end blocks are
        computed (SlidingWindowManager.get_num_skipped_tokens: the blocks
        wholly before the window of the next token are the null block)."""
        return max(0, end * self.block_size - spec.window + 1) // self.block_size

    def _op_lookup_groups(self, c, hashes: List[bytes], start: int):
        """On the ops thread: the longest hit n (blocks from start) that
        every group can supply, each group's blocks referenced: all n of a
        full-attention group, [first, start + n) of a sliding-window group
        (first from _swa_first). Returns (every group's blocks, epoch,
        tiers (per hit block, the slowest group's), n)."""
        held: List[int] = []
        try:
            n = len(hashes)
            full: Dict[int, Tuple[List[int], List[int]]] = {}
            for g, sp in enumerate(self.specs):
                if sp.window is None and n:
                    b, t = c.lookup(self.client.pools[g], hashes[:n], tiers=True)
                    held += b
                    full[g] = (b, t)
                    n = min(n, len(b))
            # Until every sliding-window group has its window for the same n
            # (a shorter hit reaches further back).
            swa: Dict[int, Tuple[int, List[int], List[int]]] = {}
            while n > 0:
                swa, n0 = {}, n
                for g, sp in enumerate(self.specs):
                    if sp.window is None:
                        continue
                    while n > 0:
                        a = max(self._swa_first(sp, start + n), start) - start
                        b, t = c.lookup(self.client.pools[g], hashes[a:n], tiers=True)
                        held += b
                        if len(b) == n - a:
                            swa[g] = (a, b, t)
                            break
                        # Block a + len(b) is missing: no hit reaches past it.
                        n = a + len(b)
                if n == n0:
                    break
            if n <= 0:
                n, swa = 0, {}
            self.client.ok()
        except kvcache.KvError as e:
            self.client.failed(e)
            if self.client.conn is c and held:
                try:
                    c.release(held)
                except kvcache.KvError:
                    pass
            return None
        # Keep what a hit of n blocks loads; everything else goes back.
        keep: List[int] = []
        tiers = [kvcache.TIER_G1] * n
        for g, (b, t) in full.items():
            keep += b[:n]
            for i in range(n):
                tiers[i] = max(tiers[i], t[i])
        for g, (a, b, t) in swa.items():
            keep += b
            for i in range(len(b)):
                tiers[a + i] = max(tiers[a + i], t[i])
        # held may name a block twice (two lookups, two references).
        want = collections.Counter(keep)
        drop = []
        for x in held:
            if want[x]:
                want[x] -= 1
            else:
                drop.append(x)
        if drop:
            try:
                c.release(drop)
            except kvcache.KvError as e:
                self.client.failed(e)
        return keep, c.restarts, tiers, n

    def _op_release(self, blocks: List[int], epoch: int) -> None:
        c = self.client.conn
        if c is None or not blocks or c.restarts != epoch:
            return   # a restart dropped them with the old daemon
        try:
            c.release(blocks)
        except kvcache.KvError as e:
            self.client.failed(e)

    def _queue_release(self, blocks: List[int], epoch: int) -> None:
        with self._rel_lock:
            self._rel.append((blocks, epoch))
            if self._rel_queued:
                return
            self._rel_queued = True
        try:
            self._ops.submit(self._op_flush)
        except RuntimeError:
            pass       # shut down: closing the connection dropped them

    def _op_flush(self) -> None:
        """On the ops thread: every queued release, one call an epoch."""
        with self._rel_lock:
            items, self._rel = self._rel, []
            self._rel_queued = False
        by_epoch: Dict[int, List[int]] = {}
        for blocks, epoch in items:
            by_epoch.setdefault(epoch, []).extend(blocks)
        for epoch, blocks in by_epoch.items():
            self._op_release(blocks, epoch)

    def _release_held(self, st: ReqState, keep: int = 0) -> None:
        if len(st.held) > keep:
            drop = st.held[keep:]
            st.held = st.held[:keep]
            st.tiers = st.tiers[:keep]
            self._queue_release(drop, st.held_epoch)

    def _keys(self, req, a: int, b: int):
        """The kvcached keys of req's blocks [a, b) (_IDENT: its block
        hashes themselves), and what the ops thread looks up: one group,
        the keys concatenated; several, the keys. vLLM's default hashes
        (bytes of 32) are their own keys: the request's list joined once,
        each hash touched once (a slice, then a join, then a pass over
        their lengths was 11 us a 2k-token request). An engine hashes
        every block with one function, so its hashes are all of one type
        and one length: the first's and the joined length say they are
        32 bytes each."""
        bh = req.block_hashes
        if not self.hybrid and bh and type(bh[0]) is bytes and len(bh[0]) == kvcache.HASH_BYTES:
            try:
                buf = b"".join(bh)
            except TypeError:
                buf = None
            if buf is not None and len(buf) == kvcache.HASH_BYTES * len(bh):
                if a or b != len(bh):
                    buf = buf[a * kvcache.HASH_BYTES:b * kvcache.HASH_BYTES]
                return _IDENT, buf
        if self.hybrid:
            keys = kv_keys(bh[a:b])
            return keys, keys
        return kv_keys_packed(bh[a:b])

    def _submit_lookups(self, st: ReqState, a: int, b: int, at: int) -> None:
        """Looks st's blocks [a, b) up, with the chains (from block 0) of up
        to lookup_batch - 1 other requests added and not asked about yet,
        in one task on the ops thread."""
        batch = _Batch()
        now = time.monotonic()
        keys, chain = self._keys(st.request, a, b)
        st.keys, st.keys_base = keys, (0 if keys is _IDENT else a)
        st.lookup, st.lookup_i, st.taken = batch, 0, False
        st.lookup_at, st.asked_since = at, now
        chains = [chain]
        starts = [a]
        unasked, reqs, bs = self._unasked, self._reqs, self.block_size
        unasked.pop(st.request.request_id, None)
        while unasked and len(chains) < self._batch:
            rid, req = unasked.popitem(last=False)
            o = reqs.get(rid)
            if o is None:
                o = reqs[rid] = ReqState(req)
            if o.lookup is not None:
                continue
            nfull = min(len(req.block_hashes), (req.num_tokens - 1) // bs)
            if nfull <= 0:
                continue
            o.keys, chain = self._keys(req, 0, nfull)
            o.keys_base = 0
            o.lookup, o.lookup_i, o.taken = batch, len(chains), False
            o.lookup_at, o.asked_since = 0, now
            chains.append(chain)
            starts.append(0)
        self._ops.submit(self._op_batch, batch, chains, starts)
        self.stats.add("lookups", len(chains))

    def _drop_lookup(self, st: ReqState) -> None:
        """Forgets a lookup; one still running releases what it finds."""
        b = st.lookup
        st.lookup = None
        st.lookup_at = -1
        if b is None or st.taken:
            return
        st.taken = True
        with b.lock:
            if b.res is None:
                # Still running: the ops thread releases it with the answers.
                if b.orphans is None:
                    b.orphans = []
                b.orphans.append(st.lookup_i)
                return
        r = b.res[st.lookup_i]
        if r:
            self._queue_release(r[0], r[1])

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        rid = request.request_id
        st = self._reqs.get(rid)
        if st is None:
            st = self._reqs[rid] = ReqState(request)
        if not self.loads_on or st.load_failed:
            return 0, False
        bs = self.block_size
        # vLLM computes at least the last token itself.
        nfull = min(len(request.block_hashes), (request.num_tokens - 1) // bs)
        start = num_computed_tokens // bs
        if nfull <= start:
            st.saved_upto = max(st.saved_upto, start)
            return 0, False
        if st.lookup is not None and st.lookup_at != num_computed_tokens:
            if not self._shift_lookup(st, start, num_computed_tokens):
                self._take_lookup(st)
                self._release_held(st)
                self._drop_lookup(st)
        if st.lookup is None:
            self._submit_lookups(st, start, nfull, num_computed_tokens)
        b = st.lookup
        res = b.res                     # no lock: set once, by the ops thread
        if res is None:
            if not b.done.wait(self._lookup_timeout):
                if time.monotonic() - st.asked_since < self._lookup_deadline:
                    self.stats.add("lookups_deferred", 1)
                    self.deferred += 1
                    return None, False  # a promotion is under way: ask again later
                self._drop_lookup(st)
                self.stats.add("lookup_failures", 1)
                return 0, False
            res = b.res
        if not st.taken:
            self._take_lookup(st, res[st.lookup_i])
        k = st.hit if self.hybrid else len(st.held)
        st.start_block = start
        st.ext_blocks = k
        st.saved_upto = max(st.saved_upto, start + k)
        st.async_load = bool(k) and (self.hybrid or (self.async_loads == "tiers" and any(
            t != kvcache.TIER_G1 for t in st.tiers[:k])))
        if k:
            self.stats.add("lookup_hit_blocks", k)
        return k * bs, st.async_load

    def _shift_lookup(self, st: ReqState, start: int, at: int) -> bool:
        """A finished lookup from block 0 (a batch's) reused for a request
        vLLM has the first start blocks of: the blocks beyond them are the
        answer (a chain from block 0 that reaches past start finds what one
        from start would). False when it cannot serve."""
        b = st.lookup
        if self.hybrid or st.lookup_at != 0 or b.res is None or st.taken:
            return False     # several groups: the window's blocks depend on start
        self._take_lookup(st)
        if len(st.held) <= start:
            return False
        head, st.held = st.held[:start], st.held[start:]
        st.tiers = st.tiers[start:]
        if head:
            self._queue_release(head, st.held_epoch)
        st.lookup_at = at
        return True

    def _take_lookup(self, st: ReqState, r: Any = _UNSET) -> None:
        """Moves a finished lookup's blocks into st.held (once); r: its
        result, when the caller has it already."""
        b = st.lookup
        if b is None or st.taken:
            return
        if r is _UNSET:
            res = b.res
            if res is None:
                return
            r = res[st.lookup_i]
        st.taken = True
        self._release_held(st)
        if r is None:
            self.stats.add("lookup_failures", 1)
            st.held, st.held_epoch, st.tiers, st.hit = _NONE, 0, _NONE, 0
        else:
            # The lookup's own lists (made for this request alone).
            st.held, st.held_epoch, st.tiers = r[0], r[1], r[2]
            st.hit = r[3] if len(r) > 3 else len(st.held)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        st = self._reqs.get(request.request_id)
        if st is None:
            return
        self._take_lookup(st)
        if st.lookup is not None and not st.taken:
            # Not answered yet (vLLM's local cache had every block, so the
            # answer was never asked for): what it finds is released.
            self._drop_lookup(st)
        n = num_external_tokens // self.block_size if num_external_tokens > 0 else 0
        if self.hybrid:
            n = min(n, st.hit)
            # The references cover a hit of st.hit blocks; a shorter one
            # loads without them (the worker looks the blocks up again).
            self._release_held(st, keep=len(st.held) if n == st.hit else 0)
        else:
            n = min(n, len(st.held))
            self._release_held(st, keep=n)
        st.lookup = None
        st.lookup_at = -1
        if n == 0:
            st.load_tiers = _NONE
            return
        st.load_tiers = st.tiers[:n]
        if self.hybrid:
            self._plan_groups_load(st, request, blocks, n)
            return
        ids = blocks.get_block_ids()[0]
        s = st.start_block
        hashes = st.keys_of(s, s + n)
        self._pending_loads.append(Load(request.request_id, hashes, list(ids[s:s + n]),
                                        st.async_load))
        st.loading = True

    def _plan_groups_load(self, st: ReqState, request, blocks, n: int) -> None:
        """A hybrid model's load of blocks [s, s + n): in each group, the
        blocks vLLM holds (the null block stands where a sliding window
        no longer reaches: nothing is loaded there)."""
        s = st.start_block
        hashes = st.keys_of(s, s + n)
        groups = []
        for g, blist in enumerate(blocks.blocks):
            hs, ids = [], []
            for i in range(s, min(s + n, len(blist))):
                b = blist[i]
                if b.is_null:
                    if ids:
                        # A hole after a held block is not a window's: load
                        # nothing of the group (no hashes: the worker
                        # fails the request's load, vLLM recomputes it).
                        hs = []
                        ids = [x.block_id for x in blist[s:s + n] if not x.is_null]
                        break
                    continue
                hs.append(hashes[i - s])
                ids.append(b.block_id)
            groups.append((g, hs, ids))
        self._pending_loads.append(Load(request.request_id, [], [], True, groups))
        st.loading = True

    def _plan_groups_save(self, meta, st: ReqState, rid: str, kv_cache_manager,
                          a: int, b: int) -> int:
        """A hybrid model's saves of blocks [a, b): one Save a group, of the
        blocks vLLM holds for it (a sliding-window group's head blocks may
        be the null block already). Returns the end saved (a when vLLM
        holds nothing for the request)."""
        try:
            per_group = kv_cache_manager.get_blocks(rid).blocks
        except Exception:
            return a
        req = st.request
        bs = self.block_size
        b = min([b] + [len(x) for x in per_group])
        if b <= a:
            return a
        hs = st.keys_of(a, b)
        try:
            ev = event_meta(req, a, b, bs)
        except Exception:
            ev = (None, None, None)
        for g, blist in enumerate(per_group):
            i = a
            while i < b and blist[i].is_null:
                i += 1
            if i >= b:
                continue
            if any(x.is_null for x in blist[i:b]):
                continue         # not a window's shape: save nothing of it
            parent = st.keys_of(i - 1, i)[0] if i > 0 else None
            extra = ev[2][i - a:] if ev[2] is not None else None
            meta.saves.append(Save(rid, hs[i - a:], parent, [x.block_id for x in blist[i:b]],
                                   list(req.all_token_ids[i * bs:b * bs]), ev[0], ev[1],
                                   extra, group=g))
        return b

    def build_connector_meta(self, scheduler_output, kv_cache_manager
                             ) -> KvcachedConnectorMetadata:
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
        # A request new to this step comes with its block ids (all of them:
        # vLLM's get_blocks); asking the cache manager again would build
        # the same list from its block objects a second time.
        new_ids = {}
        for nr in scheduler_output.scheduled_new_reqs or ():
            new_ids[nr.req_id] = nr.block_ids
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
            if self.hybrid:
                st.saved_upto = self._plan_groups_save(meta, st, rid, kv_cache_manager,
                                                       st.saved_upto, full)
                continue
            ids = new_ids.get(rid)
            try:
                ids = (ids if ids is not None else kv_cache_manager.get_block_ids(rid))[0]
            except Exception:
                continue
            a, b = st.saved_upto, min(full, len(ids))
            if b <= a:
                continue
            hs = st.keys_of(a, b)
            parent = st.keys_of(a - 1, a)[0] if a > 0 else None
            pt = req.prompt_token_ids
            if (type(pt) is list and b * bs <= len(pt)
                    and getattr(req, "prompt_is_token_ids", None) is None):
                # Prompt tokens (a list vLLM only ever appends to): copied
                # by whoever uses them (a slice of 2k tokens was 12 us).
                toks = TokenSlice(pt, a * bs, b * bs)
            else:
                toks = req.all_token_ids[a * bs:b * bs]
                if type(toks) is not list:
                    toks = list(toks)
            try:
                ev = event_meta(req, a, b, bs)
            except Exception as e:   # vLLM's internals moved: events without them
                if not getattr(self, "_meta_warned", False):
                    log.warning("kvcached: no LoRA/extra keys for KV events (%s)", e)
                    self._meta_warned = True
                ev = (None, None, None)
            # vLLM's list (the worker extends it in later steps): a copy.
            meta.saves.append(Save(rid, hs, parent,
                                   ids[a:b] if type(ids) is list else list(ids[a:b]), toks,
                                   *ev))
            st.saved_upto = b
        return meta

    def update_connector_output(self, connector_output) -> None:
        # A hybrid load that failed: vLLM puts the request back to waiting
        # (recompute) and asks again; the same answer could fail the same
        # way for ever, so it is computed without kvcached.
        for rid in getattr(connector_output, "failed_recving", None) or ():
            st = self._reqs.get(rid)
            if st is not None:
                st.load_failed = True
                # What kvcached lacked is saved again as vLLM recomputes it.
                st.saved_upto = min(st.saved_upto, st.start_block)
        wm = getattr(connector_output, "kv_connector_worker_meta", None)
        if isinstance(wm, KvcachedWorkerMetadata):
            for rid in wm.loaded:
                st = self._reqs.get(rid)
                if st is not None:
                    st.loading = False
                    self._release_held(st)

    def request_finished(self, request, block_ids) -> Tuple[bool, Optional[dict]]:
        self._unasked.pop(request.request_id, None)
        st = self._reqs.pop(request.request_id, None)
        if st is not None:
            self._take_lookup(st)
            self._release_held(st)
            self._drop_lookup(st)
        if self._pending_loads:
            self._pending_loads = [x for x in self._pending_loads
                                   if x.req_id != request.request_id]
        return False, None

    def get_external_cache_hit_sources(self, request, num_external_tokens: int):
        """num_external_tokens split by the tier kvcached found each block
        in (the lookup's tiers, kept for the load plan update_state_after_alloc
        made): G1 (kvcached's device pool) "device", G2 "host", G3 "disk", G4
        (another node) "p2p", anything else "external_unspecified"."""
        if num_external_tokens <= 0:
            return {}
        st = self._reqs.get(request.request_id)
        tiers = st.load_tiers if st is not None else []
        bs = self.block_size
        if _SOURCES is None or len(tiers) * bs != num_external_tokens:
            return {_unspecified(): num_external_tokens}
        out: Dict[Any, int] = {}
        for t in tiers:
            src = _SOURCES.get(t, _SOURCES[None])
            out[src] = out.get(src, 0) + bs
        return out

    def get_kv_connector_stats(self):
        if self.stats.is_empty():
            return None
        s, self.stats = self.stats, KvcachedConnectorStats()
        return s

    def held_references(self) -> int:
        """References the scheduler side holds now (tests, debugging)."""
        return sum(len(st.held) for st in self._reqs.values())

    def drain(self) -> None:
        """Waits until the ops thread has done everything queued so far."""
        self._ops.submit(self._op_flush).result()

    def shutdown(self) -> None:
        for st in list(self._reqs.values()):
            self._release_held(st)
            self._drop_lookup(st)
        self._ops.submit(self._op_flush)
        self._ops.submit(self.client.close)
        self._ops.shutdown(wait=True)
