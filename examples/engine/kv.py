"""KV stores: where the model keeps the keys and values of past tokens.

The model talks to a store through four calls (the `KVStore` interface):

    reserve(seq, start, end)  positions [start, end) of seq are about to be
                              written: make room (allocate blocks, copy a
                              shared partial block). Raises OutOfBlocks
                              before anything is computed, so an engine can
                              preempt and retry.
    write(seq, layer, start, k, v)
                              k, v: float32 (n_kv_heads, T, head_dim), the
                              keys (after RoPE) and values of positions
                              [start, start + T) at `layer`; stored in the
                              store's dtype.
    read(seq, layer, n) -> (K, V)
                              float32 (n_kv_heads, n, head_dim) each,
                              positions [0, n) at `layer` (views or copies;
                              the model only reads them). A float16 store
                              converts while it gathers.
    free(seq)                 drop everything the sequence holds.

`seq` is any hashable id. A store keeps no token count of its own: the caller
says which positions it writes and how many it reads.

Two stores:

  ContiguousKV  one array per sequence (grown by doubling): the plain
                reference with no blocks at all.
  PagedKV       a block table per sequence over a BlockAllocator. One block
                holds `block_size` consecutive tokens of ALL layers, K and V:

                    block: dtype, shape (n_layers, 2, n_kv_heads, block_size, head_dim)
                    block[l, 0, h, t] = K of layer l, KV head h, token t of the
                                        block (after RoPE, HF/neox rotation)
                    block[l, 1, h, t] = V of layer l, KV head h, token t

                C order: K of one layer for a block's tokens is one contiguous
                run (n_kv_heads * block_size * head_dim elements), and per head
                the tokens' vectors are consecutive rows, so the gathered K of
                a head is a plain (n, head_dim) matrix for the attention matmul.
                SmolLM2-135M (30 layers, 3 KV heads of 64) with block_size 16
                in float16: 30*2*16*3*64*2 = 368,640 bytes (360 KiB) per block,
                23,040 bytes per token; in float32 737,280 bytes per block.
                Token i of a sequence is in block table[i // block_size] at
                row i % block_size. A paged engine maps one kvcached block onto
                one such block (kvc_pool_desc: block_bytes = KVLayout.block_bytes,
                block_tokens = block_size, dtype = KVLayout.kvc_dtype, layout =
                KVLayout.describe()).

A BlockAllocator hands out blocks as opaque handles and gives a numpy view of
each (shape KVLayout.block_shape). Its calls mirror kvcached's client API
(kvc_alloc, kvc_release, kvc_fork, kvc_cow, kvc_block_ptr) so a kvcached
allocator can replace LocalBlockAllocator, the in-process one here.
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

_KVC_DTYPE = {"float16": "fp16", "float32": "fp32", "bfloat16": "bf16"}
# numpy has no bfloat16: a bfloat16 block is stored as 16-bit integers (the
# torch path, torch_model.py, computes with it; the numpy model cannot).
_NP_STORE = {"float16": "float16", "float32": "float32", "bfloat16": "uint16"}
# float64: in-process stores only (check_torch.py's exact reference for the
# cached-prefix path); no kvcached pool is described with it (kvc_dtype).
_IN_PROCESS = {"float64": "float64"}


class OutOfBlocks(MemoryError):
    """The allocator has no free block (kvcached: KV_ENOSPC)."""


@dataclass(frozen=True)
class KVLayout:
    n_layers: int
    n_kv_heads: int
    head_dim: int
    block_size: int = 16
    dtype: str = "float16"

    def __post_init__(self):
        if self.dtype not in _KVC_DTYPE and self.dtype not in _IN_PROCESS:
            raise ValueError(f"KV dtype {self.dtype!r}: float16, float32 or bfloat16 "
                             f"(float64 in process only)")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")

    @property
    def np_dtype(self) -> np.dtype:
        """The numpy dtype of a block's elements (uint16 for bfloat16)."""
        return np.dtype(_NP_STORE.get(self.dtype) or _IN_PROCESS[self.dtype])

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        return (self.n_layers, 2, self.n_kv_heads, self.block_size, self.head_dim)

    @property
    def token_bytes(self) -> int:
        """Bytes of K and V of one token, all layers."""
        return self.n_layers * 2 * self.n_kv_heads * self.head_dim * self.np_dtype.itemsize

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.token_bytes

    @property
    def kvc_dtype(self) -> str:
        """The dtype string for kvc_pool_desc ("fp16", "fp32", "bf16");
        ValueError for float64 (in-process stores only)."""
        if self.dtype not in _KVC_DTYPE:
            raise ValueError(f"KV dtype {self.dtype!r}: in-process stores only, not a pool's")
        return _KVC_DTYPE[self.dtype]

    def describe(self) -> bytes:
        """A canonical description for kvc_pool_desc.layout: processes that
        share a pool must agree on it byte for byte."""
        return json.dumps({"format": "kvcached-engine/v1",
                           "shape": ["n_layers", "kv", "n_kv_heads", "block_size", "head_dim"],
                           "n_layers": self.n_layers, "n_kv_heads": self.n_kv_heads,
                           "head_dim": self.head_dim, "block_size": self.block_size,
                           "dtype": self.dtype, "rope": "neox"},
                          sort_keys=True, separators=(",", ":")).encode()


class KVStore(ABC):
    layout: KVLayout

    @abstractmethod
    def reserve(self, seq: Hashable, start: int, end: int) -> None: ...

    @abstractmethod
    def write(self, seq: Hashable, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None: ...

    @abstractmethod
    def read(self, seq: Hashable, layer: int, n: int) -> tuple[np.ndarray, np.ndarray]: ...

    @abstractmethod
    def free(self, seq: Hashable) -> None: ...

    def fork(self, parent: Hashable, child: Hashable, n: int) -> None:
        """child starts as a copy of parent's first n positions."""
        raise NotImplementedError


class ContiguousKV(KVStore):
    """Per sequence one array (n_layers, 2, n_kv_heads, capacity, head_dim)."""

    def __init__(self, layout: KVLayout):
        self.layout = layout
        self.seqs: dict[Hashable, np.ndarray] = {}

    def reserve(self, seq, start, end):
        a = self.seqs.get(seq)
        cap = 0 if a is None else a.shape[3]
        if end <= cap:
            return
        new_cap = max(end, 2 * cap, 64)
        lay = self.layout
        b = np.zeros((lay.n_layers, 2, lay.n_kv_heads, new_cap, lay.head_dim), lay.np_dtype)
        if a is not None:
            b[:, :, :, :cap] = a
        self.seqs[seq] = b

    def write(self, seq, layer, start, k, v):
        a = self.seqs[seq]
        T = k.shape[1]
        a[layer, 0, :, start:start + T] = k
        a[layer, 1, :, start:start + T] = v

    def read(self, seq, layer, n):
        a = self.seqs[seq]
        K, V = a[layer, 0, :, :n], a[layer, 1, :, :n]
        if K.dtype != np.float32:
            K, V = K.astype(np.float32), V.astype(np.float32)
        return K, V

    def free(self, seq):
        self.seqs.pop(seq, None)

    def fork(self, parent, child, n):
        self.seqs[child] = self.seqs[parent].copy()


class BlockAllocator(ABC):
    """Blocks of `layout.block_shape`, named by opaque handles."""
    layout: KVLayout

    @abstractmethod
    def alloc(self, n: int) -> list:
        """n writable blocks, each with one reference; OutOfBlocks if not all fit."""

    @abstractmethod
    def release(self, handles: Sequence) -> None:
        """Drops one reference on each."""

    @abstractmethod
    def fork(self, handles: Sequence) -> list:
        """Another reference on each (the same handles back)."""

    @abstractmethod
    def cow(self, handles: Sequence) -> list:
        """For each block a writable one only the caller holds with the same
        contents: itself if it already is, else a copy (and the reference on
        the original is dropped). OutOfBlocks if a copy finds no room."""

    @abstractmethod
    def view(self, handle) -> np.ndarray:
        """The block's memory as a writable numpy array of layout.block_shape."""

    def free_blocks(self) -> int | None:
        return None


class LocalBlockAllocator(BlockAllocator):
    """In-process blocks: one arena array (num_blocks, *block_shape); handles
    are ints; reference counts per block."""

    def __init__(self, layout: KVLayout, num_blocks: int):
        self.layout = layout
        self.arena = np.zeros((num_blocks,) + layout.block_shape, layout.np_dtype)
        self._init_refs(num_blocks)

    def _init_refs(self, num_blocks: int):
        self.refs = np.zeros(num_blocks, np.int64)
        self._free = list(range(num_blocks - 1, -1, -1))

    def _copy_block(self, dst: int, src: int):
        """Copy-on-write's copy; subclasses with other memory override it."""
        self.arena[dst] = self.arena[src]

    def alloc(self, n):
        if n > len(self._free):
            raise OutOfBlocks(f"{n} blocks wanted, {len(self._free)} free")
        out = [self._free.pop() for _ in range(n)]
        self.refs[out] = 1
        return out

    def release(self, handles):
        for h in handles:
            if self.refs[h] <= 0:
                raise ValueError(f"block {h} released but not held")
            self.refs[h] -= 1
            if self.refs[h] == 0:
                self._free.append(h)

    def fork(self, handles):
        for h in handles:
            if self.refs[h] <= 0:
                raise ValueError(f"block {h} forked but not held")
            self.refs[h] += 1
        return list(handles)

    def cow(self, handles):
        out = []
        for h in handles:
            if self.refs[h] == 1:
                out.append(h)
                continue
            (new,) = self.alloc(1)
            self._copy_block(new, h)
            self.release([h])
            out.append(new)
        return out

    def view(self, handle):
        return self.arena[handle]

    def free_blocks(self):
        return len(self._free)

    def used_blocks(self) -> int:
        return int(np.count_nonzero(self.refs))


class PagedKV(KVStore):
    """A block table per sequence over a BlockAllocator (layout in the module
    docstring). Engines subclass it or drive `tables` directly: `adopt` a
    prefix of blocks found elsewhere (kvcached lookup), `fork` for parallel
    samples (shared blocks, copy-on-write of the partial last block when it is
    written)."""

    def __init__(self, allocator: BlockAllocator):
        self.alloc = allocator
        self.layout = allocator.layout
        self.tables: dict[Hashable, list] = {}
        self._views: dict = {}   # handle -> numpy view (kept while the handle is held)

    def _view(self, h) -> np.ndarray:
        v = self._views.get(h)
        if v is None:
            v = self._views[h] = self.alloc.view(h)
        return v

    def blocks(self, seq) -> list:
        return self.tables.get(seq, [])

    def adopt(self, seq, handles: Sequence) -> None:
        """seq starts with these blocks (references already held by the
        caller and now owned by the store), e.g. a cached prefix."""
        if seq in self.tables:
            raise ValueError(f"sequence {seq!r} exists")
        self.tables[seq] = list(handles)

    def reserve(self, seq, start, end):
        bs = self.layout.block_size
        table = self.tables.setdefault(seq, [])
        need = -(-end // bs)
        if need > len(table):
            table.extend(self.alloc.alloc(need - len(table)))
        # blocks already there that the step writes into must be ours alone
        first, last = start // bs, min(need, len(table))
        if first < last:
            old = table[first:last]
            new = self.alloc.cow(old)
            for i, (a, b) in enumerate(zip(old, new)):
                if a != b:
                    self._views.pop(a, None)
                    table[first + i] = b

    def write(self, seq, layer, start, k, v):
        bs = self.layout.block_size
        table = self.tables[seq]
        t, end = 0, start + k.shape[1]
        pos = start
        while pos < end:
            blk = self._view(table[pos // bs])
            off = pos % bs
            m = min(bs - off, end - pos)
            blk[layer, 0, :, off:off + m] = k[:, t:t + m]
            blk[layer, 1, :, off:off + m] = v[:, t:t + m]
            pos += m
            t += m

    def read(self, seq, layer, n):
        bs = self.layout.block_size
        table = self.tables[seq]
        nb = -(-n // bs)
        views = [self._view(h) for h in table[:nb]]
        # gather and convert to float32 in one pass: (n_kv_heads, nb * bs, head_dim)
        K = np.concatenate([b[layer, 0] for b in views], axis=1, dtype=np.float32)
        V = np.concatenate([b[layer, 1] for b in views], axis=1, dtype=np.float32)
        return K[:, :n], V[:, :n]

    def free(self, seq):
        table = self.tables.pop(seq, None)
        if table:
            for h in table:
                if not any(h in t for t in self.tables.values()):
                    self._views.pop(h, None)
            self.alloc.release(table)

    def fork(self, parent, child, n):
        """child shares the blocks holding parent's first n positions."""
        if child in self.tables:
            raise ValueError(f"sequence {child!r} exists")
        nb = -(-n // self.layout.block_size)
        self.tables[child] = self.alloc.fork(self.tables[parent][:nb])
