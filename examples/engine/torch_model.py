"""The reference engine's model in PyTorch (`--device cuda`): the same
Llama-architecture decoder as model.py, computing on a GPU (or, for tests,
on torch's CPU), with its KV cache in kvcached blocks read and written in
place.

model.py (numpy, float32) stays the CPU path and the reference: the
weights' layout, the RoPE convention (halves, HF/neox), 1/sqrt(head_dim)
folded into wq and the block layout (kv.py) are the same, so the same
weights give the same logits up to the order of float32 sums
(check_torch.py compares them).

KV in place. A block of kv.py's layout is (n_layers, 2, n_kv_heads,
block_size, head_dim); a row of head_dim elements is the unit here. The
client library maps every segment of a daemon device at base + offset in
one reserved virtual range (docs/architecture.md), so all blocks of a pool
lie in one address range: TorchPagedKV wraps that range, from the lowest
block address seen (the anchor) to the highest block end, as ONE tensor of
rows (`arena`, zero-copy: `__cuda_array_interface__` through
kvcache.CudaBlock on the cuda backend, a ctypes buffer on the host
backend), and names a block by the row its first byte is (block address -
anchor) / row bytes. Row of (layer l, K|V kv, head h, token t) of a block
whose first row is r:  r + ((l * 2 + kv) * n_kv_heads + h) * block_size + t.
Prefill and decode write their new K/V with one index_copy_ per layer into
those rows; attention gathers a sequence's K and V with one index_select
each per layer (the block table as a row index) into scaled-dot-product
attention (torch SDPA: flash for bfloat16, causal from the bottom right
when a cached prefix precedes the new tokens). The wrapped range holds
holes (addresses not mapped in this process); nothing reads them, since
only rows of held blocks are indexed. A block that lies below the anchor
or past the end rebuilds the arena (a new tensor over the wider range; no
copy).

Models: `TorchModel.from_numpy(model)` takes model.py's weights (the
real SmolLM2 or its seeded random stand-in); `TorchModel.random(shape,
seed)` builds seeded random weights of a named architecture (SHAPES) on the
device directly: the figures of a 3B model computed for real, with
meaningless text. Random weights are N(0, 0.02), norms 1, tied output.
"""
from __future__ import annotations

import ctypes
import time
from dataclasses import replace
from typing import Hashable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .kv import BlockAllocator, KVLayout, LocalBlockAllocator, PagedKV
from .model import Config, Model, byte_tokenizer, plan_batch

# Architectures (the published configs; RoPE scaling of Llama 3.x is left
# out: with random weights it changes nothing the figures measure).
SHAPES = {
    # HuggingFaceTB/SmolLM2-135M-Instruct: 30 layers, 9 query heads over 3
    # KV heads of 64; float16 KV: 23,040 bytes per token.
    "smollm2-135m": Config(),
    # meta-llama/Llama-3.2-3B: 28 layers, 24 query heads over 8 KV heads of
    # 128, tied embedding; bfloat16 KV: 114,688 bytes (112 KiB) per token.
    "llama-3.2-3b": Config(n_vocab=128256, n_embd=3072, n_layers=28, n_heads=24, n_kv_heads=8,
                           n_ff=8192, rope_base=500000.0, rms_eps=1e-5, n_ctx=131072),
    # meta-llama/Llama-3.1-8B: 32 layers, 32 query heads over 8 KV heads of
    # 128 (untied output; tied here: the same cost but for 1 GiB of weights);
    # bfloat16 KV: 131,072 bytes (128 KiB) per token.
    "llama-3.1-8b": Config(n_vocab=128256, n_embd=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                           n_ff=14336, rope_base=500000.0, rms_eps=1e-5, n_ctx=131072),
}

_TORCH_DTYPE = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "float64": torch.float64}   # float64: check_torch.py's exact reference
# __cuda_array_interface__ has no bfloat16: its rows are wrapped as int16
# and viewed as bfloat16.
_CAI = {"float32": ("<f4", torch.float32), "float16": ("<f2", torch.float16),
        "bfloat16": ("<i2", torch.int16), "float64": ("<f8", torch.float64)}


def kv_bytes_per_token(cfg: Config, dtype: str) -> int:
    """Bytes of K and V of one token, all layers."""
    return cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * torch.tensor(
        [], dtype=_TORCH_DTYPE[dtype]).element_size()


# ---------------------------------------------------------------------- allocators
class TorchLocalAllocator(LocalBlockAllocator):
    """In-process blocks in one torch tensor (on any device): the torch
    counterpart of kv.LocalBlockAllocator (whose reference counting it
    keeps), for tests without a daemon. Handles are ints; ptr() gives the
    block's address."""

    def __init__(self, layout: KVLayout, num_blocks: int, device="cpu"):
        self.layout = layout
        self.mem = torch.zeros(num_blocks * layout.block_bytes, dtype=torch.uint8, device=device)
        self._init_refs(num_blocks)

    def _copy_block(self, dst, src):
        bb = self.layout.block_bytes
        self.mem[dst * bb:(dst + 1) * bb] = self.mem[src * bb:(src + 1) * bb]

    def view(self, handle):
        raise NotImplementedError("torch blocks: use ptr()")

    def ptr(self, handle) -> int:
        return self.mem.data_ptr() + handle * self.layout.block_bytes


# How arenas were wrapped in this process (check_torch.py prints it).
wrap_paths: set = set()


def _cupy_wrap(ptr, rows, head_dim, typestr, device, keep, err):
    """The fallback when torch refuses the __cuda_array_interface__ (it asks
    the runtime which device the pointer is on): CuPy's unowned memory on the
    device we name, handed to torch through DLPack. Raises err without CuPy."""
    try:
        import cupy as cp
    except ImportError:
        raise err
    dt = np.dtype(typestr)
    dev = device.index if device.index is not None else torch.cuda.current_device()
    mem = cp.cuda.UnownedMemory(ptr, rows * head_dim * dt.itemsize, keep, dev)
    arr = cp.ndarray((rows, head_dim), dtype=dt, memptr=cp.cuda.MemoryPointer(mem, 0))
    wrap_paths.add("CuPy + DLPack (torch.as_tensor: %s)" % err)
    t = torch.from_dlpack(arr)
    if t.data_ptr() != ptr:
        raise RuntimeError("torch.from_dlpack copied the memory") from err
    return t


def _arena_tensor(ptr: int, rows: int, head_dim: int, dtype: str, device: torch.device,
                  keep) -> torch.Tensor:
    """A (rows, head_dim) tensor of dtype over the memory at ptr, no copy."""
    if device.type == "cuda":
        import kvcache
        typestr, tdt = _CAI[dtype]
        try:
            t = torch.as_tensor(kvcache.CudaBlock(keep, ptr, (rows, head_dim), typestr),
                                device=device)
            if t.data_ptr() != ptr:   # a copy, not the blocks: useless here
                raise RuntimeError("torch.as_tensor copied the memory")
            wrap_paths.add("__cuda_array_interface__")
        except Exception as e:  # noqa: BLE001: the fallback below, else this error
            t = _cupy_wrap(ptr, rows, head_dim, typestr, device, keep, e)
        return t if tdt == _TORCH_DTYPE[dtype] else t.view(_TORCH_DTYPE[dtype])
    esize = torch.tensor([], dtype=_TORCH_DTYPE[dtype]).element_size()
    buf = (ctypes.c_uint8 * (rows * head_dim * esize)).from_address(ptr)
    t = torch.frombuffer(buf, dtype=torch.uint8)
    return t.view(_TORCH_DTYPE[dtype]).view(rows, head_dim)


class TorchPagedKV(PagedKV):
    """kv.PagedKV whose blocks are read and written in place by torch: the
    block table of each sequence becomes a row index into one arena tensor
    (module docstring). The allocator gives block addresses: ptr(handle)
    (KvcachedAllocator: kvc_block_ptr; TorchLocalAllocator). The model calls
    rows_of() once per step and sequence, then write_rows()/read() per
    layer."""

    def __init__(self, allocator: BlockAllocator, device, keep=None):
        super().__init__(allocator)
        lay = self.layout
        self.device = torch.device(device)
        self.tdtype = _TORCH_DTYPE[lay.dtype]
        self.row_bytes = lay.head_dim * torch.tensor([], dtype=self.tdtype).element_size()
        self.block_rows = lay.block_bytes // self.row_bytes
        self.kv_rows = lay.n_kv_heads * lay.block_size   # rows of one (layer, K|V)
        self.keep = keep          # what keeps the mapping alive (the connection)
        self.anchor = 0
        self.end = 0
        self.arena: torch.Tensor | None = None
        self.rebuilds = 0
        bs, H = lay.block_size, lay.n_kv_heads
        # (H, bs): row offset of (head h, token t) inside a block's (l, kv)
        self._in_block = (torch.arange(H, device=self.device)[:, None] * bs +
                          torch.arange(bs, device=self.device)[None, :])

    def _view(self, h) -> int:
        p = self._views.get(h)
        if p is None:
            p = self._views[h] = self.alloc.ptr(h)
        return p

    def _ensure(self, lo: int, hi: int) -> None:
        if self.arena is not None and lo >= self.anchor and hi <= self.end:
            return
        anchor = lo if self.arena is None else min(lo, self.anchor)
        end = hi if self.arena is None else max(hi, self.end)
        rows = (end - anchor) // self.row_bytes
        self.arena = _arena_tensor(anchor, rows, self.layout.head_dim, self.layout.dtype,
                                   self.device, self.keep)
        self.anchor, self.end = anchor, anchor + rows * self.row_bytes
        self.rebuilds += 1

    def cover(self, seqs) -> None:
        """Makes the arena cover the blocks of positions [0, n) of every
        (seq, n): called once per step before any rows_of(), so that no
        rebuild moves the anchor under rows already computed."""
        lo = hi = None
        bs = self.layout.block_size
        for seq, n in seqs:
            for h in self.tables[seq][:-(-n // bs)]:
                p = self._view(h)
                lo = p if lo is None or p < lo else lo
                hi = p if hi is None or p > hi else hi
        if lo is not None:
            self._ensure(lo, hi + self.layout.block_bytes)

    def rows_of(self, seq, n: int) -> torch.Tensor:
        """First row of each of the blocks holding positions [0, n) of seq,
        a LongTensor on the device; the arena covers them."""
        nb = -(-n // self.layout.block_size)
        ptrs = [self._view(h) for h in self.tables[seq][:nb]]
        lo, hi = min(ptrs), max(ptrs) + self.layout.block_bytes
        self._ensure(lo, hi)    # a no-op after cover(): the anchor stays
        off = np.asarray(ptrs, dtype=np.int64) - self.anchor
        if np.any(off % self.row_bytes):
            raise RuntimeError(f"a block address is not a multiple of {self.row_bytes} bytes "
                               f"from the others: blocks cannot be indexed as rows")
        return torch.from_numpy(off // self.row_bytes).to(self.device, non_blocking=True)

    def token_rows(self, first: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """(n_kv_heads, end - start): the row of K at layer 0 of positions
        [start, end), given first = rows_of(seq, end)."""
        bs = self.layout.block_size
        pos = torch.arange(start, end, device=self.device)
        blk = first[pos // bs]                                   # (T,)
        H = self.layout.n_kv_heads
        return (blk[None, :] + torch.arange(H, device=self.device)[:, None] * bs +
                (pos % bs)[None, :])

    def all_rows(self, first: torch.Tensor, n: int) -> torch.Tensor:
        """(n_kv_heads, n): rows of K at layer 0 of positions [0, n)."""
        H, bs = self.layout.n_kv_heads, self.layout.block_size
        r = first[:, None, None] + self._in_block[None]          # (nb, H, bs)
        return r.permute(1, 0, 2).reshape(H, -1)[:, :n]

    def write_rows(self, layer: int, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """rows (H, N) of layer 0 K; k, v (H, N, D) in any float dtype."""
        base = layer * 2 * self.kv_rows
        D = self.layout.head_dim
        flat = rows.reshape(-1)
        self.arena.index_copy_(0, flat + base, k.reshape(-1, D).to(self.tdtype))
        self.arena.index_copy_(0, flat + base + self.kv_rows, v.reshape(-1, D).to(self.tdtype))

    def read_rows(self, layer: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V (H, n, D) in the KV dtype: gathered copies of the rows."""
        base = layer * 2 * self.kv_rows
        H, n = rows.shape
        flat = rows.reshape(-1)
        K = self.arena.index_select(0, flat + base).view(H, n, -1)
        V = self.arena.index_select(0, flat + base + self.kv_rows).view(H, n, -1)
        return K, V

    # kv.KVStore's numpy calls (tests, and the engine's generic paths)
    def write(self, seq, layer, start, k, v):
        end = start + k.shape[1]
        rows = self.token_rows(self.rows_of(seq, end), start, end)
        self.write_rows(layer, rows, torch.as_tensor(np.asarray(k), device=self.device),
                        torch.as_tensor(np.asarray(v), device=self.device))

    def read(self, seq, layer, n):
        K, V = self.read_rows(layer, self.all_rows(self.rows_of(seq, n), n))
        return K.float().cpu().numpy(), V.float().cpu().numpy()


# ---------------------------------------------------------------------- the model
def _causal_bias(T: int, n: int):
    """Causal mask for T queries at the END of n keys (a cached prefix
    before them): torch's lower-right causal bias, else a boolean mask."""
    try:
        from torch.nn.attention.bias import causal_lower_right
        return causal_lower_right(T, n)
    except ImportError:  # pragma: no cover (torch < 2.3)
        return None


class TorchModel:
    """model.Model's forward on torch. dtype: the weights' and activations'
    (float32 for the check against numpy, bfloat16 for speed)."""

    def __init__(self, cfg: Config, weights: dict, tok, *, device="cuda", dtype="bfloat16",
                 random: bool = False, source: str = "", name: str = "model"):
        self.cfg = cfg
        self.tok = tok
        self.device = torch.device(device)
        self.dtype = dtype
        self.tdtype = _TORCH_DTYPE[dtype]
        self.random = random
        self.source = source
        self.name = name
        self.tok_embd = weights["token_embd"]
        self.out_w = weights.get("output", self.tok_embd)
        self.out_norm = weights["output_norm"]
        self.layers = weights["layers"]
        half = cfg.head_dim // 2
        self.inv_freq = torch.tensor(cfg.rope_base ** (-np.arange(half, dtype=np.float64) * 2 /
                                                       cfg.head_dim), device=self.device)
        self._rope_n = 0
        self._cos = self._sin = None
        self.load_seconds = 0.0

    # ------------------------------------------------------------------ building
    @classmethod
    def from_numpy(cls, m: Model, device="cuda", dtype="float32") -> "TorchModel":
        """model.py's weights (the real model or its random stand-in)."""
        t0 = time.perf_counter()
        tdt = _TORCH_DTYPE[dtype]

        def T(a):
            return torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=tdt)

        w = {"token_embd": T(m.tok_embd), "output_norm": T(m.out_norm),
             "layers": [{k: T(v) for k, v in L.items()} for L in m.layers]}
        if m.out_w is not m.tok_embd:
            w["output"] = T(m.out_w)
        tm = cls(m.cfg, w, m.tok, device=device, dtype=dtype, random=m.random,
                 source=m.source, name=m.name)
        if str(device).startswith("cuda"):
            torch.cuda.synchronize()
        tm.load_seconds = time.perf_counter() - t0
        return tm

    @classmethod
    def random(cls, shape: str, seed: int = 0, device="cuda", dtype="bfloat16",
               n_layers: int | None = None, narrow: bool = False) -> "TorchModel":
        """Seeded random weights of SHAPES[shape], made on the device (the
        same seed gives the same weights on the same device and torch);
        n_layers: fewer layers than the shape's (tests on a CPU); narrow:
        the shape's KV geometry (layers, KV heads, head_dim: the same
        blocks) around a small model (one query head per KV head, a
        256-wide FFN, 2,048 tokens), so that a CPU runs the GPU's block
        layout in seconds."""
        t0 = time.perf_counter()
        c = replace(SHAPES[shape])
        if narrow:
            c = Config(n_vocab=2048, n_embd=c.n_kv_heads * c.head_dim, n_layers=c.n_layers,
                       n_heads=c.n_kv_heads, n_kv_heads=c.n_kv_heads, n_ff=256,
                       rope_base=c.rope_base, rms_eps=c.rms_eps, n_ctx=c.n_ctx)
        if n_layers:
            c.n_layers = n_layers
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        tdt = _TORCH_DTYPE[dtype]

        def w(*shp):
            return (torch.randn(*shp, generator=g, device=device, dtype=torch.float32)
                    .mul_(0.02).to(tdt))

        def ones(n):
            return torch.ones(n, device=device, dtype=tdt)

        qkv = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim
        layers = [{"attn_norm": ones(c.n_embd), "wqkv": w(c.n_embd, qkv),
                   "wo": w(c.n_heads * c.head_dim, c.n_embd), "ffn_norm": ones(c.n_embd),
                   "wgu": w(c.n_embd, 2 * c.n_ff), "wdown": w(c.n_ff, c.n_embd)}
                  for _ in range(c.n_layers)]
        weights = {"token_embd": w(c.n_vocab, c.n_embd), "output_norm": ones(c.n_embd),
                   "layers": layers}
        m = cls(c, weights, byte_tokenizer(c.n_vocab), device=device, dtype=dtype,
                random=True, source=f"{shape}{' narrow' if narrow else ''} random(seed={seed})",
                name=f"{shape}-random-s{seed}" + (f"-l{n_layers}" if n_layers else "") +
                ("-narrow" if narrow else ""))
        if str(device).startswith("cuda"):
            torch.cuda.synchronize()
        m.load_seconds = time.perf_counter() - t0
        return m

    def cast(self, dtype: str) -> "TorchModel":
        """The same weights in another dtype (a new model; float64: the exact
        reference of check_torch.py, whose rounding no random layers can
        amplify into the differences a check looks for)."""
        t = _TORCH_DTYPE[dtype]
        w = {"token_embd": self.tok_embd.to(t), "output_norm": self.out_norm.to(t),
             "layers": [{k: v.to(t) for k, v in L.items()} for L in self.layers]}
        if self.out_w is not self.tok_embd:
            w["output"] = self.out_w.to(t)
        return TorchModel(self.cfg, w, self.tok, device=self.device, dtype=dtype,
                          random=self.random, source=self.source, name=self.name)

    def kv_layout(self, block_size: int = 16, dtype: str = "float16") -> KVLayout:
        c = self.cfg
        return KVLayout(c.n_layers, c.n_kv_heads, c.head_dim, block_size, dtype)

    def weight_bytes(self) -> int:
        n = self.tok_embd.numel() + self.out_norm.numel()
        n += sum(t.numel() for L in self.layers for t in L.values())
        if self.out_w is not self.tok_embd:
            n += self.out_w.numel()
        return n * self.tok_embd.element_size()

    # ------------------------------------------------------------------ forward
    def _rope_tables(self, n: int):
        if n > self._rope_n:
            n2 = max(n, 2 * self._rope_n, 1024)
            ang = torch.arange(n2, dtype=torch.float64, device=self.device)[:, None] * \
                self.inv_freq[None, :]
            self._cos = torch.cos(ang).to(self.tdtype)
            self._sin = torch.sin(ang).to(self.tdtype)
            self._rope_n = n2
        return self._cos, self._sin

    @staticmethod
    def _rope(x, cos, sin):
        """x (N, H, d), cos/sin (N, d/2): rotate (x[i], x[i + d/2])."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)

    def _rms(self, x, w):
        xf = x.to(torch.promote_types(x.dtype, torch.float32))   # float64 stays float64
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.rms_eps)).to(
            self.tdtype) * w

    def _attention(self, q, K, V, start: int):
        """q (T, Hq, d) of positions [start, start+T), already scaled; K, V
        (Hk, n, d), n = start + T. Returns (T, Hq*d)."""
        c = self.cfg
        T, n = q.shape[0], K.shape[1]
        g = c.n_heads // c.n_kv_heads
        if K.dtype != self.tdtype:
            K, V = K.to(self.tdtype), V.to(self.tdtype)
        if g > 1:
            K = K.repeat_interleave(g, dim=0)
            V = V.repeat_interleave(g, dim=0)
        qh = q.permute(1, 0, 2)[None]                         # (1, Hq, T, d)
        Kh, Vh = K[None], V[None]
        if T == 1:
            o = F.scaled_dot_product_attention(qh, Kh, Vh, scale=1.0)
        elif start == 0:
            o = F.scaled_dot_product_attention(qh, Kh, Vh, is_causal=True, scale=1.0)
        else:
            bias = _causal_bias(T, n)
            if bias is None:
                bias = (torch.arange(n, device=q.device)[None, :] <=
                        (start + torch.arange(T, device=q.device))[:, None])
            o = F.scaled_dot_product_attention(qh, Kh, Vh, attn_mask=bias, scale=1.0)
        return o[0].permute(1, 0, 2).reshape(T, c.n_heads * c.head_dim)

    @torch.inference_mode()
    def forward(self, batch: Sequence[tuple[Hashable, Sequence[int], int]], kv: TorchPagedKV,
                *, all_logits: bool = False) -> list[np.ndarray]:
        """model.Model.forward on torch: the same contract (every
        sequence's reserve() before any compute), the KV in kv's blocks.
        Returns float32 numpy logits (float64 for a float64 model; copied
        to the host: the step's end)."""
        c = self.cfg
        segs, toks, pos = plan_batch(c, kv, batch)
        n = len(toks)
        dev = self.device
        toks_t = torch.tensor(toks, dtype=torch.long).to(dev, non_blocking=True)
        pos_t = torch.tensor(pos, dtype=torch.long).to(dev, non_blocking=True)
        cos_t, sin_t = self._rope_tables(max(pos) + 1)
        cos, sin = cos_t[pos_t], sin_t[pos_t]
        # Rows of every sequence's blocks (layer 0, K): where the new tokens
        # go and what attention reads.
        plan = []
        wrows = []
        kv.cover([(seq, start + b - a) for seq, start, a, b in segs])
        for seq, start, a, b in segs:
            first = kv.rows_of(seq, start + b - a)
            wrows.append(kv.token_rows(first, start, start + b - a))
            plan.append(kv.all_rows(first, start + b - a))
        wrows = torch.cat(wrows, dim=1)                        # (Hk, N)
        x = self.tok_embd[toks_t]
        nq, nk = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        for li, L in enumerate(self.layers):
            h = self._rms(x, L["attn_norm"])
            qkv = h @ L["wqkv"]
            qk = self._rope(qkv[:, :nq + nk].view(n, c.n_heads + c.n_kv_heads, c.head_dim),
                            cos, sin)
            q = qk[:, :c.n_heads]
            k = qk[:, c.n_heads:].transpose(0, 1)              # (Hk, N, d)
            v = qkv[:, nq + nk:].view(n, c.n_kv_heads, c.head_dim).transpose(0, 1)
            kv.write_rows(li, wrows, k, v)
            outs = []
            for (seq, start, a, b), rows in zip(segs, plan):
                K, V = kv.read_rows(li, rows)
                outs.append(self._attention(q[a:b], K, V, start))
            attn = outs[0] if len(outs) == 1 else torch.cat(outs)
            x = x + attn @ L["wo"]
            h = self._rms(x, L["ffn_norm"])
            gu = h @ L["wgu"]
            x = x + (F.silu(gu[:, :c.n_ff]) * gu[:, c.n_ff:]) @ L["wdown"]
        rows = torch.arange(n, device=dev) if all_logits else \
            torch.tensor([b - 1 for _, _, _, b in segs], device=dev)
        hN = self._rms(x[rows], self.out_norm)
        logits = (hN @ self.out_w.T).to(torch.promote_types(self.tdtype, torch.float32))
        logits = logits.cpu().numpy()
        if all_logits:
            return [logits[a:b] for _, _, a, b in segs]
        return [logits[i] for i in range(len(segs))]
