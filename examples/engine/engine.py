"""The reference engine: SmolLM2 (model.py) with its KV cache in kvcached.

What an engine author integrates, in one file:

  KvcachedAllocator  kv.BlockAllocator over a kvcache.Connection: one kvcached
                     block per `block_size` tokens of all layers (kv.py has
                     the layout); KV_ENOSPC / KV_EQUOTA become OutOfBlocks.
  Engine             a block table per sequence (kv.PagedKV); before prefill
                     it hashes the prompt's full blocks (kvcache.hash_chain,
                     with the engine's cache salt) and looks the chain up, so
                     only the rest is computed; every block that fills is
                     sealed under its hash (with its token ids, for KV
                     events), so other processes reuse it; several sequences
                     per step (continuous batching); n > 1 samples fork the
                     prompt's blocks (the partial last block is copied on its
                     first write); when a block cannot be had, the newest
                     running sequence is preempted: swapped out to the
                     daemon's host tier and back ("swap"), or released and
                     recomputed ("recompute", which finds its sealed prefix
                     again); a finished sequence releases everything.

    from engine.model import Model
    from engine.engine import Engine

    model = Model.load()
    with Engine(model, socket="/run/kvcached/kvcached.sock") as eng:
        (out,) = eng.generate(["The capital of France is"], max_tokens=16)
        print(out.text, out.ttft_s, out.hit_tokens)

Hashing: the prompt is hashed as kvcached's chain (SHA-256 by default) over
token ids, salted with `salt` (processes with different salts never share a
prefix) and keyed by nothing else: the model and the layout are in the pool
name and layout, which the daemon checks.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Hashable, Optional, Sequence

import numpy as np

import kvcache

from .kv import BlockAllocator, KVLayout, OutOfBlocks, PagedKV
from .model import Model, sample


class KvcachedAllocator(BlockAllocator):
    """Blocks of a kvcached pool; handles are kvcache block handles."""

    def __init__(self, conn: kvcache.Connection, pool: kvcache.Pool, layout: KVLayout):
        self.conn, self.pool, self.layout = conn, pool, layout

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except kvcache.KvError as e:
            if e.code in (kvcache.ENOSPC, kvcache.EQUOTA):
                raise OutOfBlocks(str(e)) from e
            raise

    def alloc(self, n):
        return self._call(self.conn.alloc, self.pool, n)

    def release(self, handles):
        self.conn.release(list(handles))

    def fork(self, handles):
        return self.conn.fork(list(handles))

    def cow(self, handles):
        return self._call(self.conn.cow, list(handles))

    def view(self, handle):
        return self.conn.view(self.pool, handle)

    def ptr(self, handle) -> int:
        """The block's address here (a device address on the cuda backend)."""
        return self.conn.block_ptr(handle)


@dataclass
class Output:
    """One generated sequence."""
    text: str
    tokens: list                  # generated ids (end of generation excluded)
    prompt_tokens: list
    finish: str = "length"        # "eog" or "length"
    ttft_s: float = 0.0           # admission to the first token
    hit_tokens: int = 0           # prompt tokens found in kvcached (not computed)
    computed_tokens: int = 0      # prompt tokens computed
    preemptions: int = 0
    logits: list = field(default_factory=list)  # per generated token, with keep_logits


@dataclass
class _Seq:
    sid: Hashable
    out: Output
    hashes: list                  # the chain so far: one per full block
    max_tokens: int
    rng: np.random.Generator
    n: int = 0                    # positions in the KV cache
    sealed: int = 0               # blocks of the table sealed under hashes[:sealed]
    next_token: Optional[int] = None  # sampled, not yet in the cache
    t0: float = 0.0
    swap: Optional[int] = None    # swapped out: the daemon's swap id
    nblocks: int = 0              # blocks swapped out
    done: bool = False


class Engine:
    """SmolLM2 over kvcached. preempt: "swap" or "recompute"; salt: the cache
    salt (tenants that must not share prefixes use different salts);
    max_batch: sequences per decode step; prefix_cache=False: no lookup and
    no sealing (every prompt computed in full: the baseline of the engine
    benchmark)."""

    def __init__(self, model: Model, socket: Optional[str] = None, *, block_size: int = 16,
                 dtype: str = "float16", salt: Optional[str] = None, preempt: str = "swap",
                 namespace: Optional[str] = None, max_batch: int = 8,
                 conn: Optional[kvcache.Connection] = None, prefix_cache: bool = True):
        if preempt not in ("swap", "recompute"):
            raise ValueError("preempt: swap or recompute")
        self.model = model
        self.layout = model.kv_layout(block_size, dtype)
        self.salt = salt
        self.preempt_policy = preempt
        self.max_batch = max_batch
        self.prefix_cache = prefix_cache
        self.conn = conn or kvcache.connect(socket, namespace, "kvcached-engine")
        # The pool names the model: different weights must never share KV
        # (a random-weights model's name carries its shape and seed).
        mname = model.name
        name = f"{mname}/{dtype}/b{block_size}"
        self.pool = self.conn.register_pool(
            name, block_bytes=self.layout.block_bytes, block_tokens=block_size,
            dtype=self.layout.kvc_dtype, layout=self.layout.describe(),
            model=mname, shape=self.layout.block_shape)
        alloc = KvcachedAllocator(self.conn, self.pool, self.layout)
        if getattr(model, "device", None) is not None:
            # torch_model.TorchModel: blocks read and written in place by
            # torch (on the cuda backend: device memory).
            from .torch_model import TorchPagedKV
            self.kv = TorchPagedKV(alloc, model.device, keep=self.conn)
        else:
            self.kv = PagedKV(alloc)
        self._ids = 0
        self.stats = {"preemptions": 0, "hit_tokens": 0, "computed_tokens": 0}

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ hashing
    def _chain(self, tokens: Sequence[int]) -> list:
        return kvcache.hash_chain(tokens, self.layout.block_size, salt=self.salt)

    def _seal_full(self, s: _Seq, tokens: Sequence[int]) -> None:
        """Seals the blocks of s that are full and not sealed yet."""
        bs = self.layout.block_size
        full = s.n // bs
        if full <= s.sealed or not self.prefix_cache:
            return
        while len(s.hashes) < full:
            i = len(s.hashes)
            parent = s.hashes[-1] if s.hashes else None
            s.hashes.append(kvcache.hash_block(tokens[i * bs:(i + 1) * bs], parent,
                                               salt=self.salt))
        table = self.kv.tables[s.sid]
        blocks = table[s.sealed:full]
        parent = s.hashes[s.sealed - 1] if s.sealed else None
        got = self.conn.seal(self.pool, blocks, s.hashes[s.sealed:full],
                             token_ids=tokens[s.sealed * bs:full * bs], parent=parent)
        for i, (a, b) in enumerate(zip(blocks, got)):
            if a != b:  # the daemon had it already: ours was freed, use its block
                self.kv._views.pop(a, None)
                table[s.sealed + i] = b
        s.sealed = full

    # ------------------------------------------------------------ admission
    def _admit(self, s: _Seq, tokens: list) -> Optional[np.ndarray]:
        """Looks the cached prefix up, computes the rest of tokens; returns
        the last token's logits, or None when it had to wait (preempted)."""
        bs = self.layout.block_size
        chain = self._chain(tokens) if self.prefix_cache else []
        hit = self.conn.lookup(self.pool, chain) if chain else []
        # The last token is always computed: its logits are the next token's.
        keep = min(len(hit), (len(tokens) - 1) // bs)
        if keep < len(hit):
            self.conn.release(hit[keep:])
            hit = hit[:keep]
        self.kv.adopt(s.sid, hit)
        s.hashes = chain[:keep]
        s.sealed = keep
        start = keep * bs
        try:
            (logits,) = self.model.forward([(s.sid, tokens[start:], start)], self.kv)
        except OutOfBlocks:
            self.kv.free(s.sid)
            return None
        s.n = len(tokens)
        s.hashes = chain[:keep]
        self._seal_full(s, tokens)
        s.out.hit_tokens += start
        s.out.computed_tokens += len(tokens) - start
        self.stats["hit_tokens"] += start
        self.stats["computed_tokens"] += len(tokens) - start
        return logits

    # ------------------------------------------------------------ preemption
    def _preempt(self, s: _Seq) -> None:
        s.out.preemptions += 1
        self.stats["preemptions"] += 1
        table = self.kv.tables.pop(s.sid)
        for h in table:
            self.kv._views.pop(h, None)
        if self.preempt_policy == "swap":
            try:
                s.swap = self.conn.swap_out(table)
                s.nblocks = len(table)
                return
            except kvcache.KvError as e:
                if e.code != kvcache.ENOSPC:
                    raise
                # No room in the host tier: recompute instead.
        self.conn.release(table)
        s.swap = None
        s.n = -1  # recompute from the tokens

    def _resume(self, s: _Seq) -> bool:
        """Brings a preempted sequence back; False when there is no room yet."""
        tokens = s.out.prompt_tokens + s.out.tokens
        if s.swap is not None:
            try:
                blocks = self.conn.swap_in(s.swap, s.nblocks)
            except kvcache.KvError as e:
                if e.code == kvcache.ENOSPC:
                    return False
                raise
            self.kv.adopt(s.sid, blocks)
            # Copies now, unsealed: the sealed ones are in the daemon's index.
            s.swap = None
            return True
        # Recompute: everything but the token sampled last, which the next
        # step feeds.
        logits = self._admit(s, tokens[:-1] if s.next_token is not None else tokens)
        return logits is not None

    # ------------------------------------------------------------ generation
    def generate(self, prompts: Sequence, max_tokens: int = 32, *, n: int = 1,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                 seed: Optional[int] = 0, chat: bool = False, keep_logits: bool = False,
                 stop_at_eog: bool = True, on_step=None) -> list:
        """Generates for every prompt (text or token ids); n samples each
        (forked from the prompt's blocks). Returns one Output per sample,
        prompt by prompt. on_step(engine), if given, runs after every decode
        step (the block tables are in engine.kv.tables)."""
        tok = self.model.tok
        waiting, running, finished = [], [], []
        for p in prompts:
            ids = (tok.encode_chat([{"role": "user", "content": p}]) if chat else tok.encode(p)
                   ) if isinstance(p, str) else list(p)
            if not ids:
                raise ValueError("empty prompt")
            waiting.append(ids)
        order = []
        samp = dict(temperature=temperature, top_p=top_p, top_k=top_k)
        base_seed = seed if seed is not None else int(time.time_ns() & 0xffffffff)

        def new_seq(ids, k):
            self._ids += 1
            s = _Seq(("s", self._ids), Output("", [], list(ids)), [], max_tokens,
                     np.random.default_rng([base_seed, len(order), k]))
            s.t0 = time.perf_counter()
            order.append(s)
            return s

        def emit(s, logits):
            if keep_logits:
                s.out.logits.append(logits)
            t = sample(logits, rng=s.rng, **samp)
            if not s.out.tokens and s.out.ttft_s == 0.0:
                s.out.ttft_s = time.perf_counter() - s.t0
            if stop_at_eog and tok.is_eog(t):
                s.out.finish = "eog"
                s.done = True
                return
            s.out.tokens.append(t)
            if len(s.out.tokens) >= s.max_tokens:
                s.done = True
            else:
                s.next_token = t

        resume_ok = True
        while waiting or running:
            # Admission: one prompt per step while there is room in the batch
            # and no preempted sequence waits for its blocks.
            preempted = any(s.sid not in self.kv.tables for s in running)
            if waiting and len(running) < self.max_batch and not preempted:
                ids = waiting[0]
                s = new_seq(ids, 0)
                logits = self._admit(s, ids)
                if logits is None:
                    order.pop()
                    if not running:
                        raise OutOfBlocks("the pool cannot hold one prompt")
                else:
                    waiting.pop(0)
                    group = [s]
                    for k in range(1, n):
                        c = new_seq(ids, k)
                        c.t0 = s.t0
                        self.kv.fork(s.sid, c.sid, s.n)
                        c.n, c.hashes, c.sealed = s.n, list(s.hashes), s.sealed
                        c.out.hit_tokens = s.out.hit_tokens
                        c.out.computed_tokens = s.out.computed_tokens
                        group.append(c)
                    for g in group:
                        emit(g, logits)
                        (finished if g.done else running).append(g)
                    for g in group:
                        if g.done:
                            self.kv.free(g.sid)
            # One decode step for the running sequences that hold their blocks.
            # Preempted ones come back once a sequence has finished (its
            # blocks are free), or when nothing else runs: coming back at once
            # would take the blocks the preemption freed for the others.
            live = [s for s in running if s.sid in self.kv.tables]
            for s in [s for s in running if s.sid not in self.kv.tables]:
                if (resume_ok or not live) and self._resume(s):
                    live.append(s)
            if not live:
                if running and not waiting:
                    raise OutOfBlocks("no running sequence can get its blocks back")
                continue
            try:
                outs = self.model.forward([(s.sid, [s.next_token], s.n) for s in live], self.kv)
            except OutOfBlocks:
                # Preempt the newest running sequence that holds blocks; the
                # others go on next step.
                if len(live) == 1:
                    raise
                victim = max(live, key=lambda x: order.index(x))
                self._preempt(victim)
                resume_ok = False
                continue
            for s, logits in zip(live, outs):
                s.n += 1
                s.next_token = None
                self._seal_full(s, s.out.prompt_tokens + s.out.tokens)
                emit(s, logits)
            if on_step:
                on_step(self)
            for s in [s for s in running if s.done]:
                running.remove(s)
                finished.append(s)
                self.kv.free(s.sid)
                resume_ok = True
        for s in order:
            s.out.text = tok.decode(s.out.tokens, special=False)
        return [s.out for s in order]
