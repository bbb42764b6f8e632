"""The worker side's data path: where each vLLM block of each layer lies in
vLLM's KV tensors, and the batched copies between them and kvcached blocks.

Imports numpy and, when given CUDA tensors, torch (and CuPy when present);
never vLLM, so it runs (and scripts/gpu-vllm-datapath tests it) where vLLM is
not installed.

Layout. vLLM 0.33 gives a connector one 4-D view per layer, logical
``[B, H, N, C]`` (blocks, heads, tokens, content bytes: K and V), whose strides
follow the resolved physical layout (LBNHC for NHD, LBHNC for HND, LHBNC,
and the block-outermost BLHNC/BLNHC/BHLNC, where one block holds every
layer). ``LayerLayout`` reduces one layer's view to: the address of block 0,
the stride between blocks, and a few equal contiguous *runs* per block (one
for the layer-compact layouts, H for LHBNC). A kvcached block holds one vLLM
block of every layer: layer 0's runs, in physical order, then layer 1's, and
so on; ``order`` names the physical order of H and N inside a run, so two
engines whose layouts differ never share a pool (the pool's name and layout
carry it).

Copies. A transfer of n blocks of one layer is n x runs copies of
``run_bytes`` each between two address lists. ``HostCopier`` does them with
memmove (host backend: both sides are this process's memory).
``CudaCopier`` launches one kernel per layer over the address lists (CuPy's
RawKernel, compiled once by NVRTC), or, without CuPy, batches them with
``torch._foreach_copy_`` (a few launches per layer). Both run on the stream
that is current, so a load ordered before the forward needs no event.
"""
from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np


@dataclass
class LayerLayout:
    """Where vLLM block b of one layer lies: runs at
    ``base + b * block_stride + run_offsets[r]``, each ``run_bytes`` long."""
    name: str
    base: int
    block_stride: int
    run_offsets: Tuple[int, ...]
    run_bytes: int
    num_blocks: int
    order: str           # physical order of the non-singleton inner dims, e.g. "NHC"
    device: str          # "cpu" or "cuda:N"

    @property
    def layer_bytes(self) -> int:
        return len(self.run_offsets) * self.run_bytes


def analyze_layer(name: str, t, num_blocks: int) -> LayerLayout:
    """The layout of one of vLLM's per-layer KV views (a 4-D torch tensor,
    logical [B, H, N, C], or the 5-D [2, B, N, H, D] of older FlashAttention
    views with K and V apart). num_blocks: the KV cache manager's block
    count; when the kernel splits a manager block into k kernel blocks, the
    view has num_blocks * k rows and a manager block covers k of them.
    Raises ValueError for a view this connector cannot copy."""
    el = t.element_size()
    shape = list(t.shape)
    strides = [s * el for s in t.stride()]
    if len(shape) == 5 and shape[0] == 2:
        # [2, B, ...]: K and V are two runs-groups of the same block.
        kv_stride = strides[0]
        inner = LayerLayout_from(name, t.data_ptr(), shape[1:], strides[1:], el, num_blocks,
                                 t.device)
        offs = tuple(o + k * kv_stride for k in (0, 1) for o in inner.run_offsets)
        return LayerLayout(name, inner.base, inner.block_stride, offs, inner.run_bytes,
                           num_blocks, "K" + inner.order, inner.device)
    if len(shape) != 4:
        raise ValueError(f"{name}: a KV view of shape {tuple(shape)}; kvcached's vLLM "
                         "connector copies 4-D [B, H, N, C] views (vLLM 0.33)")
    return LayerLayout_from(name, t.data_ptr(), shape, strides, el, num_blocks, t.device)


def LayerLayout_from(name, ptr, shape, strides, el, num_blocks, device) -> LayerLayout:
    rows, inner, istr = shape[0], shape[1:], strides[1:]
    if rows % num_blocks:
        raise ValueError(f"{name}: {rows} rows is not a multiple of {num_blocks} blocks")
    ratio = rows // num_blocks
    if istr[-1] != el:
        raise ValueError(f"{name}: the innermost dimension is not contiguous")
    # Physical order: inner dims by stride, outermost first; singletons drop.
    dims = [(istr[i], inner[i], "HNC"[i]) for i in range(3) if inner[i] > 1 or i == 2]
    dims.sort(key=lambda d: -d[0])
    order = "".join(d[2] for d in dims)
    # A kvcached block holds the manager block's bytes in the unsplit
    # physical order, whatever the kernel split: the ratio kernel blocks
    # of a manager block each hold N/ratio of its tokens, so where a dim
    # sits outside N (H in HNC) the runs go (h, kernel block), never
    # (kernel block, h) - else an engine that splits and one that does not
    # would read each other's bytes permuted. Token-major orders (NHC)
    # put the kernel blocks outermost, as they are.
    n_pos = order.find("N")
    split_outer = ratio > 1 and 0 <= n_pos and any(order.index(d[2]) < n_pos for d in dims
                                                   if d[2] != "N")
    run = inner[2] * el
    outer = []
    merged = True
    for stride, size, label in reversed(dims[:-1]):       # innermost first
        if merged and stride == run and not (split_outer and order.index(label) < n_pos):
            run *= size
        else:
            merged = False
            outer.append((stride, size))
    outer.reverse()                                        # outermost first
    offs = [sum(i * s for i, (s, _) in zip(idx, outer))
            for idx in itertools.product(*[range(n) for _, n in outer])] or [0]
    kstride = strides[0]
    if ratio > 1:
        if len(offs) == 1 and kstride == run:
            run *= ratio           # the kernel blocks of a manager block are adjacent
        elif split_outer:
            offs = [o + k * kstride for o in offs for k in range(ratio)]
        else:
            offs = [k * kstride + o for k in range(ratio) for o in offs]
    dev = str(device)
    if dev.startswith("cuda") and ":" not in dev:
        dev = "cuda:0"
    return LayerLayout(name, ptr, kstride * ratio, tuple(offs), run, num_blocks, order, dev)


class BlockLayout:
    """One kvcached block = one vLLM block of every layer, in ``layers``'
    order."""

    def __init__(self, layers: Sequence[LayerLayout]):
        if not layers:
            raise ValueError("no KV layers")
        self.layers = list(layers)
        self.offsets = []
        off = 0
        for ly in self.layers:
            self.offsets.append(off)
            off += ly.layer_bytes
        self.block_bytes = off
        devs = {ly.device for ly in self.layers}
        if len(devs) != 1:
            raise ValueError(f"KV layers on several devices: {sorted(devs)}")
        self.device = devs.pop()
        orders = {ly.order for ly in self.layers}
        self.order = "/".join(sorted(orders))

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def addresses(self, li: int, kv_ptrs: Sequence[int], block_ids: Sequence[int]
                  ) -> Tuple[np.ndarray, np.ndarray]:
        """For layer li: the kvcached-side and the vLLM-side address of every
        run of the given block pairs, as two uint64 arrays of equal length."""
        ly = self.layers[li]
        nr = len(ly.run_offsets)
        kv = (np.asarray(kv_ptrs, dtype=np.uint64)[:, None] + np.uint64(self.offsets[li])
              + (np.arange(nr, dtype=np.uint64) * np.uint64(ly.run_bytes))[None, :])
        bid = np.asarray(block_ids, dtype=np.int64)
        if bid.size and (bid.min() < 0 or bid.max() >= ly.num_blocks):
            raise ValueError(f"block id out of range 0..{ly.num_blocks - 1}")
        vl = (np.uint64(ly.base) + bid.astype(np.uint64)[:, None] * np.uint64(ly.block_stride)
              + np.asarray(ly.run_offsets, dtype=np.uint64)[None, :])
        return kv.reshape(-1), vl.reshape(-1)


class HostCopier:
    """memmove between this process's memory (the host backend)."""
    name = "host"

    def __init__(self, layout: BlockLayout):
        self.layout = layout

    def copy(self, li: int, kv_ptrs, block_ids, to_kv: bool) -> int:
        kv, vl = self.layout.addresses(li, kv_ptrs, block_ids)
        n = self.layout.layers[li].run_bytes
        src, dst = (vl, kv) if to_kv else (kv, vl)
        mm = ctypes.memmove
        for s, d in zip(src.tolist(), dst.tolist()):
            mm(d, s, n)
        return n * len(kv)

    def copy_all(self, kv_ptrs, block_ids, to_kv: bool) -> int:
        """Every layer of the block pairs; returns the bytes copied."""
        return sum(self.copy(li, kv_ptrs, block_ids, to_kv)
                   for li in range(len(self.layout.layers)))

    def sync(self) -> None:
        pass


_KERNEL = r"""
// Copies nruns runs of equal length: run r from src[r] to dst[r]. blockIdx.x
// walks the runs, blockIdx.y and the threads split a run, so a few long
// runs still fill the device.
extern "C" __global__ void kv_copy_runs16(const unsigned long long *src,
        const unsigned long long *dst, unsigned long long words, unsigned long long nruns) {
    for (unsigned long long r = blockIdx.x; r < nruns; r += gridDim.x) {
        const uint4 *s = (const uint4 *)src[r];
        uint4 *d = (uint4 *)dst[r];
        for (unsigned long long w = (unsigned long long)blockIdx.y * blockDim.x + threadIdx.x;
             w < words; w += (unsigned long long)blockDim.x * gridDim.y)
            d[w] = s[w];
    }
}
extern "C" __global__ void kv_copy_runs1(const unsigned long long *src,
        const unsigned long long *dst, unsigned long long bytes, unsigned long long nruns) {
    for (unsigned long long r = blockIdx.x; r < nruns; r += gridDim.x) {
        const unsigned char *s = (const unsigned char *)src[r];
        unsigned char *d = (unsigned char *)dst[r];
        for (unsigned long long w = (unsigned long long)blockIdx.y * blockDim.x + threadIdx.x;
             w < bytes; w += (unsigned long long)blockDim.x * gridDim.y)
            d[w] = s[w];
    }
}
"""


class CudaCopier:
    """Device-to-device copies between kvcached's zero-copy mapping and
    vLLM's KV tensors. engine: "cupy" (one kernel per layer), "torch"
    (torch._foreach_copy_ over per-run views), or "auto" (CuPy when it
    imports). All work goes on torch's current stream."""

    def __init__(self, layout: BlockLayout, engine: str = "auto"):
        import torch
        self.torch = torch
        self.layout = layout
        self.dev = torch.device(layout.device)
        self._cp = None
        if engine in ("auto", "cupy"):
            try:
                import cupy
                with cupy.cuda.Device(self.dev.index or 0):
                    mod = cupy.RawModule(code=_KERNEL)
                    self._k16 = mod.get_function("kv_copy_runs16")
                    self._k1 = mod.get_function("kv_copy_runs1")
                self._cp = cupy
            except Exception:
                if engine == "cupy":
                    raise
        self._tri = None
        if self._cp is None and engine in ("auto", "triton"):
            try:
                self._tri = _triton_kernel()
            except Exception:
                if engine == "triton":
                    raise
        self.name = "cupy" if self._cp is not None else "triton" if self._tri else "torch"
        self._kv_views: Dict[Tuple[int, int], object] = {}
        self._keep: list = []      # address tensors the launched kernels still read

    def _upload(self, arrays: List[np.ndarray]):
        """The address lists on the device, in one copy: a device tensor and
        the device address of each list in it."""
        torch = self.torch
        host = torch.from_numpy(np.concatenate(arrays).view(np.int64))
        if torch.cuda.is_available():
            host = host.pin_memory()
        addr = host.to(self.dev, non_blocking=True)
        self._keep.append(host)
        self._keep.append(addr)
        self._addr = addr
        base, out = addr.data_ptr(), []
        for a in arrays:
            out.append(base)
            base += 8 * len(a)
        return out

    def _launch(self, src: np.ndarray, dst: np.ndarray, nbytes: int, sp=None, dp=None) -> None:
        cp, torch = self._cp, self.torch
        n = len(src)
        if sp is None:
            sp, dp = self._upload([src, dst])
        if self._tri is not None:
            aligned = nbytes % 8 == 0 and not ((src | dst) % np.uint64(8)).any()
            words = nbytes // 8 if aligned else nbytes
            blk = 1024
            # The kernel reads the address lists through int64 tensors over
            # the uploaded buffer.
            st = self._addr
            base = st.data_ptr()
            s_t = st[(sp - base) // 8:(sp - base) // 8 + n]
            d_t = st[(dp - base) // 8:(dp - base) // 8 + n]
            self._tri[(n, (words + blk - 1) // blk)](s_t, d_t, words, WIDE=aligned, BLOCK=blk)
            return
        stream = cp.cuda.ExternalStream(torch.cuda.current_stream(self.dev).cuda_stream)
        aligned = nbytes % 16 == 0 and not ((src | dst) % np.uint64(16)).any()
        units = nbytes // 16 if aligned else nbytes
        # About 4 units a thread in a run, at most 64 blocks a run.
        grid = (int(min(n, 1 << 20)), int(max(1, min(64, units // 1024))))
        with cp.cuda.Device(self.dev.index or 0), stream:
            if aligned:
                self._k16(grid, (256,), (np.uint64(sp), np.uint64(dp), np.uint64(nbytes // 16),
                                        np.uint64(n)))
            else:
                self._k1(grid, (256,), (np.uint64(sp), np.uint64(dp), np.uint64(nbytes),
                                       np.uint64(n)))

    def _views(self, addrs: np.ndarray, nbytes: int):
        """uint8 tensors over device addresses (the torch engine)."""
        torch = self.torch
        out = []
        for a in addrs.tolist():
            v = self._kv_views.get((a, nbytes))
            if v is None:
                v = torch.as_tensor(_CAI(a, nbytes), device=self.dev)
                if len(self._kv_views) < 1 << 16:
                    self._kv_views[(a, nbytes)] = v
            out.append(v)
        return out

    def copy(self, li: int, kv_ptrs, block_ids, to_kv: bool) -> int:
        if not len(kv_ptrs):
            return 0
        kv, vl = self.layout.addresses(li, kv_ptrs, block_ids)
        n = self.layout.layers[li].run_bytes
        src, dst = (vl, kv) if to_kv else (kv, vl)
        if self._cp is not None or self._tri is not None:
            self._launch(src, dst, n)
        else:
            self.torch._foreach_copy_(self._views(dst, n), self._views(src, n))
        return n * len(kv)

    def copy_all(self, kv_ptrs, block_ids, to_kv: bool) -> int:
        """Every layer of the block pairs: the address lists of all layers
        go to the device in one copy, then one kernel a layer."""
        if not len(kv_ptrs):
            return 0
        if self._cp is None and self._tri is None:
            return sum(self.copy(li, kv_ptrs, block_ids, to_kv)
                       for li in range(len(self.layout.layers)))
        lists, sizes = [], []
        for li in range(len(self.layout.layers)):
            kv, vl = self.layout.addresses(li, kv_ptrs, block_ids)
            src, dst = (vl, kv) if to_kv else (kv, vl)
            lists += [src, dst]
            sizes.append(self.layout.layers[li].run_bytes)
        dev = self._upload(lists)
        total = 0
        for li, nb in enumerate(sizes):
            src, dst = lists[2 * li], lists[2 * li + 1]
            self._launch(src, dst, nb, dev[2 * li], dev[2 * li + 1])
            total += nb * len(src)
        return total

    def sync(self) -> None:
        self.torch.cuda.current_stream(self.dev).synchronize()
        self._keep = []


_TRITON = None


def _triton_kernel():
    """The copy kernel in Triton (vLLM's CUDA environments have Triton):
    program (r, t) copies tile t of run r; WIDE copies 8-byte words."""
    global _TRITON
    if _TRITON is not None:
        return _TRITON
    import triton
    import triton.language as tl

    @triton.jit
    def kv_copy_runs(src_ptrs, dst_ptrs, n, WIDE: tl.constexpr, BLOCK: tl.constexpr):
        r = tl.program_id(0)
        t = tl.program_id(1)
        if WIDE:
            s = tl.load(src_ptrs + r).to(tl.pointer_type(tl.int64))
            d = tl.load(dst_ptrs + r).to(tl.pointer_type(tl.int64))
        else:
            s = tl.load(src_ptrs + r).to(tl.pointer_type(tl.uint8))
            d = tl.load(dst_ptrs + r).to(tl.pointer_type(tl.uint8))
        offs = t * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(d + offs, tl.load(s + offs, mask=m), mask=m)

    _TRITON = kv_copy_runs
    return _TRITON


class _CAI:
    """A device byte range for torch.as_tensor."""

    def __init__(self, ptr: int, n: int):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False),
                                         "strides": None, "version": 3}


def make_copier(layout: BlockLayout, engine: str = "auto"):
    """The copier for the layout's device: HostCopier for CPU tensors,
    CudaCopier for CUDA ones."""
    if layout.is_cuda:
        return CudaCopier(layout, engine)
    return HostCopier(layout)


def physical_order(layer_view_order: Sequence[int], shape_bytes: Sequence[int]) -> str:
    """The ``order`` LayerLayout gives a view, from vLLM's layout (the
    physical order of the logical [B, H, N, C] axes) and a block's logical
    shape (H, N, C bytes): what the scheduler side names the pool with
    before any tensor exists."""
    labels = {1: "H", 2: "N", 3: "C"}
    sizes = {1: shape_bytes[0], 2: shape_bytes[1], 3: shape_bytes[2]}
    return "".join(labels[a] for a in layer_view_order if a != 0 and (sizes[a] > 1 or a == 3))
