"""kvcache: Python binding of libkvcache, the client library of kvcached.

kvcached is the node's KV-cache memory daemon: it owns the KV memory of every
GPU (or, on the host backend, of the machine) as a page pool. An engine
connects, registers the KV layout it uses as a pool, and allocates, seals
(publishes under a content hash), looks up, forks, copies-on-write, swaps and
releases KV blocks; blocks are mapped into the engine's process, so
``Connection.view()`` is a zero-copy array over the block's bytes, and every
process of the same namespace sees the same bytes.

A minimal engine step::

    import kvcache, numpy as np

    with kvcache.connect() as c:                      # $KVCACHED_SOCKET or the default
        pool = c.register_pool("llama-8b/fp16", block_bytes=2 << 20, block_tokens=16,
                               dtype="fp16", shape=(32, 2, 8, 16, 128))
        hashes = kvcache.hash_chain(prompt_tokens, 16)  # one per full block
        hit = c.lookup(pool, hashes)                  # the cached prefix, referenced
        new = c.alloc(pool, len(hashes) - len(hit))   # room for the rest
        for b in new:
            kv = c.view(pool, b)                      # numpy, shape (32, 2, 8, 16, 128)
            ...                                       # prefill writes K and V here
        c.seal(pool, new, hashes[len(hit):])          # now other processes find them
        ...
        c.release(hit + new)                          # head of the chain first

Errors: every failure raises ``KvError``; ``e.code`` is the stable negative
code of the C API (``kvcache.ENOSPC`` ... for the daemon's, ``-errno`` for a
socket or local failure), ``e.name`` its name ("KV_ENOSPC"), ``str(e)`` the
daemon's own message. An engine that gets ``ENOSPC`` from ``alloc`` preempts a
sequence (``swap_out`` or release and recompute) and tries again; ``ESTALE``
after ``Connection.restarts`` grew means the daemon restarted and the block
table's handles are gone (treat them as misses).

Covered: every function of client/kvcache.h — connect/close/restarts,
register_pool (with the KV-events model name), alloc, seal (with token ids for
KV events), lookup, release, fork, cow, swap_out/swap_in, block_ptr,
pool_block_bytes, last_error/strerror, default_socket, hash_seed, hash_block,
hash_chain, and the vLLM-compatible hashes (vllm_seed, vllm_block,
vllm_chain).

Zero-copy: on the host backend ``view()`` returns a numpy array over the
block's memory (numpy is imported only then); on the cuda backend a
``CudaBlock`` with ``__cuda_array_interface__`` (version 3), which
``torch.as_tensor`` and ``cupy.asarray`` wrap without a copy. A view keeps its
connection object alive, but the memory belongs to the daemon's pool: after
``release`` the block may be given to another sequence, so drop the view with
the handle. Threads: a Connection may be shared (calls are serialized by the
library); use one per thread for parallelism.

Loading: the library meson built or installed with this package, or
$KVCACHE_LIB. From the build tree: ``PYTHONPATH=build/python python3``; after
``meson install``: the site-packages directory meson printed (see
docs/python.md).
"""
from __future__ import annotations

import ctypes
import errno as _errno
import os
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

from . import _native
from ._native import lib as _lib

__all__ = [
    "KvError", "Connection", "Pool", "CudaBlock", "connect", "default_socket", "strerror",
    "hash_seed", "hash_block", "hash_chain", "vllm_seed", "vllm_block", "vllm_chain",
    "SHA256", "XXH3_128", "HASH_BYTES",
    "EINVAL", "ENOSPC", "ENOENT", "ESTALE", "EPERM", "EPROTO", "EVERSION", "EEXIST", "E2BIG",
    "EINTERNAL", "ESTATE", "ESHUTDOWN", "EIO", "ECONFIG", "EACCES", "EQUOTA", "EAGAIN",
]

# Errors the daemon reports (client/kvcache.h): -(1000 + the protocol's code).
EINVAL = -1001
ENOSPC = -1002
ENOENT = -1003
ESTALE = -1004
EPERM = -1005
EPROTO = -1006
EVERSION = -1007
EEXIST = -1008
E2BIG = -1009
EINTERNAL = -1010
ESTATE = -1011
ESHUTDOWN = -1012
EIO = -1013
ECONFIG = -1016
EACCES = -1017
EQUOTA = -1018
EAGAIN = -1019

_NAMES = {v: "KV_" + k for k, v in globals().items() if k.startswith("E") and isinstance(v, int)}

SHA256 = 0     # the default hash: prompts are adversarial input
XXH3_128 = 1   # opt-in, for trusted deployments
HASH_BYTES = 32

Block = int
Hash = bytes


class KvError(Exception):
    """A failed call. ``code``: the C API's negative code (``kvcache.ENOSPC``,
    ... or -errno); ``name``: "KV_ENOSPC", "EPIPE", ...; ``message``: the
    daemon's message when it sent one, else the library's description."""

    def __init__(self, code: int, message: str = "", call: str = ""):
        self.code = code
        if code in _NAMES:
            self.name = _NAMES[code]
        else:
            self.name = _errno.errorcode.get(-code, str(code))
        self.message = message or strerror(code)
        self.call = call
        super().__init__(f"{call + ': ' if call else ''}{self.name}: {self.message}")


def strerror(code: int) -> str:
    """The library's description of an error code."""
    return _lib.kvc_strerror(code).decode("utf-8", "replace")


def default_socket() -> str:
    """The daemon's socket path as the daemon, kvctl and the library resolve
    it: $KVCACHED_SOCKET, else /run/kvcached/kvcached.sock for root, else
    $XDG_RUNTIME_DIR/kvcached.sock."""
    buf = ctypes.create_string_buffer(4096)
    r = _lib.kvc_default_socket(buf, len(buf))
    if r < 0:
        raise KvError(r, call="default_socket")
    return buf.value.decode()


def _enc(s: Optional[Union[str, bytes]]) -> Optional[bytes]:
    if s is None:
        return None
    return s if isinstance(s, bytes) else s.encode("utf-8")


def _blocks(bs: Iterable[int]) -> Tuple[ctypes.Array, int]:
    bs = list(bs)
    return (ctypes.c_uint64 * max(len(bs), 1))(*bs), len(bs)


def _hashes(hs: Iterable[bytes]) -> Tuple[ctypes.Array, int]:
    hs = list(hs)
    arr = (_native.Hash * max(len(hs), 1))()
    for i, h in enumerate(hs):
        if len(h) != HASH_BYTES:
            raise ValueError(f"hash {i}: {len(h)} bytes, not {HASH_BYTES}")
        ctypes.memmove(arr[i].b, bytes(h), HASH_BYTES)
    return arr, len(hs)


def _hash_out(n: int) -> ctypes.Array:
    return (_native.Hash * max(n, 1))()


def _event_keys(extra_keys, n: int, keep: list) -> Tuple[ctypes.Array, ctypes.Array]:
    """Connection.seal()'s extra_keys as kvc_seal_info's nkeys and keys;
    the byte strings they point to are appended to keep."""
    per = list(extra_keys)
    if len(per) != n:
        raise ValueError(f"extra_keys has {len(per)} entries for {n} blocks")
    flat = []
    counts = (ctypes.c_uint32 * max(n, 1))()
    for i, ks in enumerate(per):
        ks = () if ks is None else tuple(ks)
        counts[i] = len(ks)
        flat.extend(ks)
    arr = (_native.EventKey * max(len(flat), 1))()
    for j, k in enumerate(flat):
        e = arr[j]
        if isinstance(k, str):
            data, e.kind = k.encode(), 1
        elif isinstance(k, (bytes, bytearray, memoryview)):
            data, e.kind = bytes(k), 2
        elif (isinstance(k, (tuple, list)) and len(k) == 2 and isinstance(k[0], str)
              and isinstance(k[1], int) and not isinstance(k[1], bool)
              and -2**63 <= k[1] < 2**63):
            data, e.kind, e.offset = k[0].encode(), 3, k[1]
        else:
            raise TypeError(f"extra key {k!r}: a str, bytes or (str, int64) pair")
        buf = ctypes.create_string_buffer(data, len(data) or 1)
        keep.append(buf)
        e.data = ctypes.cast(buf, ctypes.c_void_p)
        e.len = len(data)
    return counts, arr


def _tokens(tokens: Sequence[int]) -> Tuple[ctypes.Array, int]:
    try:
        import numpy as np
        if isinstance(tokens, np.ndarray):
            a = np.ascontiguousarray(tokens, dtype=np.uint32)
            return (ctypes.c_uint32 * max(a.size, 1)).from_buffer_copy(a.tobytes() or b"\0" * 4), a.size
    except ImportError:
        pass
    t = list(tokens)
    return (ctypes.c_uint32 * max(len(t), 1))(*t), len(t)


class Pool:
    """A registered pool: ``id`` (what the C API calls the pool), the block
    geometry, and, when given at registration, the numpy ``dtype`` and
    ``shape`` that ``Connection.view()`` gives a block."""

    def __init__(self, pid: int, name: str, block_bytes: int, block_tokens: int,
                 dtype: str, shape: Optional[Tuple[int, ...]], device: int):
        self.id = pid
        self.name = name
        self.block_bytes = block_bytes
        self.block_tokens = block_tokens
        self.dtype = dtype
        self.shape = shape
        self.device = device

    def __int__(self) -> int:
        return self.id

    def __repr__(self) -> str:
        return (f"Pool(id={self.id}, name={self.name!r}, block_bytes={self.block_bytes}, "
                f"block_tokens={self.block_tokens}, dtype={self.dtype!r}, shape={self.shape})")


# kvcached's dtype names -> numpy's.
_NP_DTYPES = {"fp16": "float16", "f16": "float16", "float16": "float16", "bf16": None,
              "fp32": "float32", "f32": "float32", "float32": "float32", "u8": "uint8",
              "uint8": "uint8", "int8": "int8", "fp8": "uint8", "fp8_e4m3": "uint8",
              "fp8_e5m2": "uint8", "": "uint8"}
_CAI_TYPES = {"float16": "<f2", "float32": "<f4", "uint8": "|u1", "int8": "|i1"}


def _np_dtype(dtype: str) -> str:
    d = _NP_DTYPES.get(dtype, dtype)
    if d is None:
        # numpy has no bfloat16: the bytes as 16-bit integers.
        return "uint16"
    return d


class CudaBlock:
    """A block on the cuda backend: device memory, exposed through
    ``__cuda_array_interface__`` (torch.as_tensor(b, device="cuda"),
    cupy.asarray(b)). ``ptr`` is the device address; the owning connection is
    kept alive by this object."""

    def __init__(self, conn: "Connection", ptr: int, shape: Tuple[int, ...], typestr: str):
        self._conn = conn
        self.ptr = ptr
        self.shape = shape
        self.typestr = typestr

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.typestr, "data": (self.ptr, False),
                "strides": None, "version": 3}


_cuda = None


def _is_device_pointer(ptr: int) -> bool:
    """Whether ptr is CUDA device memory (the cuda backend): asks the driver
    when there is one; on a machine without it every block is host memory."""
    global _cuda
    if _cuda is None:
        try:
            _cuda = ctypes.CDLL("libcuda.so.1")
            _cuda.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int,
                                                     ctypes.c_uint64]
            _cuda.cuPointerGetAttribute.restype = ctypes.c_int
        except OSError:
            _cuda = False
    if not _cuda:
        return False
    mem_type = ctypes.c_uint(0)
    # CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2; CU_MEMORYTYPE_DEVICE = 2. An error
    # (no context, not a CUDA address) means host memory.
    r = _cuda.cuPointerGetAttribute(ctypes.byref(mem_type), 2, ptr)
    return r == 0 and mem_type.value == 2


class Connection:
    """A connection to kvcached (``kvcache.connect()``). A context manager:
    leaving the ``with`` block closes it, and the daemon drops every
    reference it held (sealed blocks stay cached for others)."""

    def __init__(self, socket: Optional[str] = None, namespace: Optional[str] = None,
                 client_name: Optional[str] = None, cuda_device: Optional[int] = None):
        self._c = ctypes.c_void_p()
        opt = _native.Options(_enc(namespace), _enc(client_name),
                              0 if cuda_device is None else cuda_device + 1)
        r = _lib.kvc_connect(_enc(socket), ctypes.byref(opt), ctypes.byref(self._c))
        if r < 0:
            raise KvError(r, call="connect")
        self.socket = socket or default_socket()
        self.namespace = namespace
        self.pools: dict = {}

    # -- lifetime --

    def close(self) -> None:
        """Closes the connection and unmaps every block (views become
        invalid). Idempotent."""
        if self._c:
            _lib.kvc_close(self._c)
            self._c = ctypes.c_void_p()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def closed(self) -> bool:
        return not self._c

    def _h(self):
        if not self._c:
            raise KvError(-_errno.EBADF, "the connection is closed")
        return self._c

    def _check(self, r: int, call: str) -> int:
        if r < 0:
            msg = _lib.kvc_last_error(self._c) if self._c else None
            raise KvError(r, (msg or b"").decode("utf-8", "replace"), call)
        return r

    @property
    def restarts(self) -> int:
        """How many times the library reconnected after the daemon died or
        restarted: block handles from before a change are stale."""
        return _lib.kvc_restarts(self._c) if self._c else 0

    @property
    def last_error(self) -> str:
        """The daemon's message for this thread's last failed call ("" if none)."""
        m = _lib.kvc_last_error(self._h())
        return (m or b"").decode("utf-8", "replace")

    # -- pools --

    def register_pool(self, name: str, block_bytes: int, block_tokens: int, dtype: str = "",
                      layout: Union[bytes, str] = b"", device: int = 0,
                      model: Optional[str] = None,
                      shape: Optional[Sequence[int]] = None) -> Pool:
        """Registers (or joins) the pool ``name``. Workers of one model share
        a pool: name, block_bytes, block_tokens, dtype and layout (opaque
        bytes describing the layout) must match (else ``EEXIST``). ``model``
        names the model in KV events' topics. ``shape`` (not sent) is what
        ``view()`` gives a block; its product times the dtype's size must be
        block_bytes."""
        lay = _enc(layout) or b""
        lbuf = ctypes.create_string_buffer(lay, len(lay)) if lay else None
        d = _native.PoolDesc(_enc(name), device, block_bytes, block_tokens, _enc(dtype),
                             ctypes.cast(lbuf, ctypes.c_void_p) if lbuf else None, len(lay))
        r = _lib.kvc_register_pool_model(self._h(), ctypes.byref(d), _enc(model))
        self._check(r, "register_pool")
        shp = tuple(int(x) for x in shape) if shape is not None else None
        if shp is not None:
            import numpy as np
            if int(np.prod(shp)) * np.dtype(_np_dtype(dtype)).itemsize != block_bytes:
                raise ValueError(f"shape {shp} of {dtype or 'uint8'} is not {block_bytes} bytes")
        p = Pool(r, name, block_bytes, block_tokens, dtype, shp, device)
        self.pools[r] = p
        return p

    def block_bytes(self, pool: Union[Pool, int]) -> int:
        """Bytes of one block of the pool (0 for one this connection does not
        know)."""
        return _lib.kvc_pool_block_bytes(self._h(), int(pool))

    # -- blocks --

    def alloc(self, pool: Union[Pool, int], n: int) -> List[Block]:
        """n writable blocks (one reference each, this connection's), evicting
        cached blocks in LRU order if needed. ``ENOSPC``/``EQUOTA`` when they
        cannot be had."""
        out = (ctypes.c_uint64 * max(n, 1))()
        if n == 0:
            return []
        self._check(_lib.kvc_alloc(self._h(), int(pool), n, out), "alloc")
        return list(out[:n])

    def seal(self, pool: Union[Pool, int], blocks: Sequence[Block], hashes: Sequence[Hash],
             token_ids: Optional[Sequence[int]] = None, parent: Optional[Hash] = None,
             lora_name: Optional[str] = None, lora_id: Optional[int] = None,
             extra_keys: Optional[Sequence[Optional[Sequence[Any]]]] = None) -> List[Block]:
        """Seals full blocks under their hashes; returns the blocks now held in
        their place (the same handle, or an existing block with that hash:
        then the one given was freed). With ``token_ids`` (len(blocks) x
        block_tokens ids; the blocks one chain in order, ``parent`` the hash
        before the first) KV events carry them.

        For the events' ``BlockStored`` (docs/events.md), as vLLM's own
        carries them: ``lora_name`` and ``lora_id`` (vLLM's
        ``lora_request.name`` and ``.adapter_id``; None: nil), and
        ``extra_keys``, one entry per block, as vLLM's
        ``to_event_extra_keys()`` makes them (vllm/v1/core/kv_cache_utils.py):
        None for a block hashed without extra keys, else a tuple of its keys
        in order, each a ``str`` (LoRA name, cache salt), ``bytes``
        (prompt-embeds digest) or an ``(identifier, offset)`` pair (a
        multimodal item). None (the default): the events leave extra_keys
        out. The daemon refuses (``EINVAL``, nothing sealed) a lora_name over
        256 bytes, over 64 keys a block, a key over 1024 bytes; a key of
        another type is a ``TypeError``."""
        b, n = _blocks(blocks)
        h, nh = _hashes(hashes)
        if nh != n:
            raise ValueError(f"{n} blocks and {nh} hashes")
        if n == 0:
            return []
        out = (ctypes.c_uint64 * n)()
        if lora_name is None and lora_id is None and extra_keys is None:
            if token_ids is None:
                r = _lib.kvc_seal(self._h(), int(pool), b, h, n, out)
            else:
                t, nt = _tokens(token_ids)
                par = None
                if parent is not None:
                    par, _ = _hashes([parent])
                r = _lib.kvc_seal_tokens(self._h(), int(pool), b, h, n, par, t, nt, out)
            self._check(r, "seal")
            return list(out[:n])
        info = _native.SealInfo()
        keep = []      # what info points into, alive until the call returns
        if token_ids is not None:
            t, info.ntokens = _tokens(token_ids)
            info.token_ids = ctypes.cast(t, ctypes.POINTER(ctypes.c_uint32))
            keep.append(t)
        if parent is not None:
            par, _ = _hashes([parent])
            info.parent = ctypes.cast(par, ctypes.POINTER(_native.Hash))
            keep.append(par)
        if lora_name is not None:
            info.lora_name = str(lora_name).encode()
        if lora_id is not None:
            if isinstance(lora_id, bool) or not 0 <= int(lora_id) < 2**64:
                raise ValueError(f"lora_id {lora_id!r}: an integer in [0, 2**64)")
            info.lora_id = int(lora_id)
        if extra_keys is not None:
            nk, keys = _event_keys(extra_keys, n, keep)
            info.nkeys = ctypes.cast(nk, ctypes.POINTER(ctypes.c_uint32))
            info.keys = ctypes.cast(keys, ctypes.POINTER(_native.EventKey))
            keep += [nk, keys]
        r = _lib.kvc_seal_events(self._h(), int(pool), b, h, n, ctypes.byref(info), out)
        self._check(r, "seal")
        return list(out[:n])

    def lookup(self, pool: Union[Pool, int], chain: Sequence[Hash]) -> List[Block]:
        """The longest cached prefix of a hash chain (head first), each block
        with a reference taken for this connection."""
        h, n = _hashes(chain)
        if n == 0:
            return []
        out = (ctypes.c_uint64 * n)()
        k = self._check(_lib.kvc_lookup(self._h(), int(pool), h, n, out), "lookup")
        return list(out[:k])

    def release(self, blocks: Sequence[Block]) -> None:
        """Drops one reference on each block; list a chain head first (its
        tail is then evicted first). Sealed blocks stay cached."""
        b, n = _blocks(blocks)
        if n:
            self._check(_lib.kvc_release(self._h(), b, n), "release")

    def fork(self, blocks: Sequence[Block]) -> List[Block]:
        """Another reference on each block (parallel sampling, beam search);
        each needs its own release()."""
        b, n = _blocks(blocks)
        if n == 0:
            return []
        out = (ctypes.c_uint64 * n)()
        self._check(_lib.kvc_fork(self._h(), b, n, out), "fork")
        return list(out[:n])

    def cow(self, blocks: Sequence[Block]) -> List[Block]:
        """Copy-on-write: for each block a writable one only this connection
        holds, with the same bytes (the block itself when it is already
        writable and held once; else a copy, and the reference on the old one
        is dropped)."""
        b, n = _blocks(blocks)
        if n == 0:
            return []
        out = (ctypes.c_uint64 * n)()
        self._check(_lib.kvc_cow(self._h(), b, n, out), "cow")
        return list(out[:n])

    def swap_out(self, blocks: Sequence[Block]) -> int:
        """Preemption by swap: the daemon copies the blocks to its host tier
        and drops this connection's references when the copy ends; returns
        the swap id for swap_in() at once. An alloc() or cow() of this
        namespace that needs the room waits for the copy, so a sequence can
        be swapped out and another allocated for at once. ``ENOSPC`` when the
        host tier cannot hold them."""
        b, n = _blocks(blocks)
        sw = ctypes.c_uint64()
        self._check(_lib.kvc_swap_out(self._h(), b, n, ctypes.byref(sw)), "swap_out")
        return sw.value

    def swap_in(self, swap: int, n: int) -> List[Block]:
        """Brings a swapped sequence back into n new writable blocks, in the
        order given to swap_out(). ``ENOSPC``: not now, the swap is kept."""
        out = (ctypes.c_uint64 * max(n, 1))()
        k = self._check(_lib.kvc_swap_in(self._h(), swap, out, n), "swap_in")
        return list(out[:k])

    # -- memory --

    def block_ptr(self, block: Block) -> int:
        """The block's address in this process (a CUDA device address on the
        cuda backend). Raises ``ESTALE`` for a handle whose segment is not
        mapped here."""
        p = _lib.kvc_block_ptr(self._h(), block)
        if not p:
            raise KvError(ESTALE, "the block is not mapped in this process", "block_ptr")
        return p

    def buffer(self, pool: Union[Pool, int], block: Block) -> memoryview:
        """The block's bytes as a writable memoryview (host backend)."""
        n = self.block_bytes(pool)
        arr = (ctypes.c_uint8 * n).from_address(self.block_ptr(block))
        arr._kvcache_conn = self  # the mapping lives as long as the connection
        return memoryview(arr).cast("B")

    def view(self, pool: Union[Pool, int], block: Block, dtype: Optional[str] = None,
             shape: Optional[Sequence[int]] = None):
        """The block as an array without a copy: a numpy array on the host
        backend, a ``CudaBlock`` (``__cuda_array_interface__``) on the cuda
        backend. dtype and shape default to the pool's (register_pool's
        ``dtype`` and ``shape``; else bytes)."""
        p = self.pools.get(int(pool))
        dt = _np_dtype(dtype if dtype is not None else (p.dtype if p else ""))
        shp = tuple(shape) if shape is not None else (p.shape if p and p.shape else None)
        n = self.block_bytes(pool)
        ptr = self.block_ptr(block)
        if _is_device_pointer(ptr):
            if shp is None:
                shp = (n // int(_CAI_TYPES.get(dt, "|u1")[2:]),)
            return CudaBlock(self, ptr, shp, _CAI_TYPES.get(dt, "|u1"))
        import numpy as np
        arr = (ctypes.c_uint8 * n).from_address(ptr)
        arr._kvcache_conn = self
        a = np.frombuffer(arr, dtype=np.uint8).view(dt)
        return a.reshape(shp) if shp is not None else a


def connect(socket: Optional[str] = None, namespace: Optional[str] = None,
            client_name: Optional[str] = None,
            cuda_device: Optional[int] = None) -> Connection:
    """Connects to kvcached and says Hello. socket: None for default_socket();
    namespace: None for the caller's own ("uid-<uid>"), or one the operator
    granted; client_name: shown by ``kvctl clients``. cuda_device (cuda
    backend): None maps each device's blocks for the GPU they live on, found
    by UUID whatever CUDA_VISIBLE_DEVICES says and whatever context is
    current; an ordinal of this process gives that GPU access too (peer
    access; ``ENODEV`` without it). Raises KvError (``EACCES`` for a
    namespace this uid may not open)."""
    return Connection(socket, namespace, client_name, cuda_device)


# -- block hashes --

def _extra(lora_id: int, salt: Optional[bytes], mm: Optional[bytes]):
    if not lora_id and not salt and not mm:
        return None, ()
    s = _enc(salt) if isinstance(salt, str) else salt
    sb = ctypes.create_string_buffer(s, len(s)) if s else None
    mb = ctypes.create_string_buffer(mm, len(mm)) if mm else None
    e = _native.HashExtra(lora_id, ctypes.cast(sb, ctypes.c_void_p) if sb else None,
                          len(s) if s else 0, ctypes.cast(mb, ctypes.c_void_p) if mb else None,
                          len(mm) if mm else 0)
    return ctypes.byref(e), (e, sb, mb)


def _algo(algo: Union[int, str]) -> int:
    if isinstance(algo, str):
        return {"sha256": SHA256, "xxh3": XXH3_128, "xxh3_128": XXH3_128}[algo.lower()]
    return algo


def hash_seed() -> Hash:
    """The fixed parent of a chain's first block."""
    h = _native.Hash()
    _lib.kvc_hash_seed(ctypes.byref(h))
    return bytes(h.b)


def hash_block(tokens: Sequence[int], parent: Optional[Hash] = None,
               algo: Union[int, str] = SHA256, lora_id: int = 0,
               salt: Optional[Union[bytes, str]] = None, mm: Optional[bytes] = None) -> Hash:
    """One block's hash: parent None is the seed. ``salt`` isolates tenants'
    caches (different salts never share), ``lora_id`` and ``mm`` (a
    multimodal input's hash) are keys too."""
    t, n = _tokens(tokens)
    par = None
    if parent is not None:
        par, _ = _hashes([parent])
    ex, keep = _extra(lora_id, salt, mm)
    out = _native.Hash()
    r = _lib.kvc_hash_block(_algo(algo), par, t, n, ex, ctypes.byref(out))
    if r < 0:
        raise KvError(r, call="hash_block")
    del keep
    return bytes(out.b)


def hash_chain(tokens: Sequence[int], block_tokens: int, algo: Union[int, str] = SHA256,
               lora_id: int = 0, salt: Optional[Union[bytes, str]] = None,
               mm: Optional[bytes] = None) -> List[Hash]:
    """The hashes of the full blocks of a token sequence, as a chain (block i
    covers tokens [i*block_tokens, (i+1)*block_tokens)); the partial last
    block is not hashed."""
    t, n = _tokens(tokens)
    nb = n // block_tokens if block_tokens else 0
    out = _hash_out(nb)
    ex, keep = _extra(lora_id, salt, mm)
    r = _lib.kvc_hash_chain(_algo(algo), t, n, block_tokens, ex, out, nb)
    if r < 0:
        raise KvError(r, call="hash_chain")
    del keep
    return [bytes(out[i].b) for i in range(r)]


def _vkeys(lora_name: Optional[str], cache_salt: Optional[str]):
    if lora_name is None and not cache_salt:
        return None
    return ctypes.byref(_native.VllmKeys(_enc(lora_name), _enc(cache_salt)))


MmItem = Tuple[str, int, int]


def _vextra(lora_name, lora_path, cache_salt, mm, prompt_embeds, legacy_keys):
    """The C description of a request's extra keys, and what must stay alive
    while it is used."""
    if legacy_keys:
        if lora_path is not None or mm or prompt_embeds is not None:
            raise ValueError("legacy_keys: vLLM <= 0.30 hashed only lora_name and cache_salt")
        return None, None
    if lora_name is None and not cache_salt and not mm and prompt_embeds is None:
        return None, None
    items = list(mm or ())
    marr = (_native.VllmMm * max(len(items), 1))()
    keep = []
    for k, (ident, offset, length) in enumerate(items):
        b = _enc(ident)
        keep.append(b)
        marr[k] = _native.VllmMm(b, int(offset), int(length))
    pe, npe = None, 0
    if prompt_embeds is not None:
        pe, npe = _hashes(list(prompt_embeds))
    x = _native.VllmExtra(_enc(lora_name), _enc(lora_path), _enc(cache_salt),
                          marr if items else None, len(items), pe, npe)
    return ctypes.byref(x), (x, marr, keep, pe)


def vllm_seed(pythonhashseed: Optional[str] = None) -> Hash:
    """vLLM's NONE_HASH for a PYTHONHASHSEED value; None (the default) gives
    what vLLM >= 0.29 uses when PYTHONHASHSEED is unset, the fixed seed
    "vllm-none-hash" (vLLM <= 0.28 drew a random one: pass its
    PYTHONHASHSEED to agree with it)."""
    out = _native.Hash()
    r = _lib.kvc_hash_vllm_seed(_enc(pythonhashseed), ctypes.byref(out))
    if r < 0:
        raise KvError(r, call="vllm_seed")
    return bytes(out.b)


def vllm_block(parent: Hash, tokens: Sequence[int], first: bool = True,
               lora_name: Optional[str] = None, cache_salt: Optional[str] = None, *,
               start: Optional[int] = None, lora_path: Optional[str] = None,
               mm: Optional[Sequence[MmItem]] = None,
               prompt_embeds: Optional[Sequence[Hash]] = None,
               legacy_keys: bool = False) -> Hash:
    """One block's hash as vLLM >= 0.31's hash_block_tokens computes it with
    sha256_cbor; parent is the previous block's hash or vllm_seed() for the
    first. The extra keys describe the whole request, as for vllm_chain();
    ``start`` is the block's first token in it (needed with ``mm`` or
    ``prompt_embeds``; else ``first`` says whether it is 0). legacy_keys=True: vLLM <= 0.30's
    untagged [lora_name, cache_salt] instead."""
    t, n = _tokens(tokens)
    par, _ = _hashes([parent])
    out = _native.Hash()
    if legacy_keys:
        _vextra(lora_name, lora_path, cache_salt, mm, prompt_embeds, True)
        r = _lib.kvc_hash_vllm_block(par, t, n, _vkeys(lora_name, cache_salt), int(first),
                                     ctypes.byref(out))
    else:
        if start is None:
            # Without mm or prompt_embeds only "is it the first block"
            # matters (the cache salt).
            if mm or prompt_embeds is not None:
                raise ValueError("vllm_block: start is needed (the block's first token)")
            start = 0 if first else max(n, 1)
        x, keep = _vextra(lora_name, lora_path, cache_salt, mm, prompt_embeds, False)
        r = _lib.kvc_hash_vllm_block_extra(par, t, n, start, x, ctypes.byref(out))
        del keep
    if r < 0:
        raise KvError(r, call="vllm_block")
    return bytes(out.b)


def vllm_chain(tokens: Sequence[int], block_tokens: int, pythonhashseed: Optional[str] = None,
               lora_name: Optional[str] = None, cache_salt: Optional[str] = None, *,
               lora_path: Optional[str] = None, mm: Optional[Sequence[MmItem]] = None,
               prompt_embeds: Optional[Sequence[Hash]] = None,
               legacy_keys: bool = False) -> List[Hash]:
    """The full blocks of a token sequence hashed as vLLM >= 0.31 does with
    sha256_cbor (hash_block_tokens over get_request_block_hasher's blocks).

    pythonhashseed: the engine's PYTHONHASHSEED; None: it has none (vLLM >=
    0.29's fixed default). The request's extra keys, tagged and ordered as
    vLLM does: lora_name with lora_path (("lora", name, path)), mm as
    (identifier, offset, length) per multimodal item sorted by offset,
    cache_salt (first block only), prompt_embeds as one 32-byte SHA-256 per
    block. legacy_keys=True: vLLM <= 0.30's untagged [lora_name,
    cache_salt] instead (no lora_path, mm or prompt_embeds)."""
    t, n = _tokens(tokens)
    nb = n // block_tokens if block_tokens else 0
    out = _hash_out(nb)
    if legacy_keys:
        _vextra(lora_name, lora_path, cache_salt, mm, prompt_embeds, True)
        r = _lib.kvc_hash_vllm_chain(_enc(pythonhashseed), t, n, block_tokens,
                                     _vkeys(lora_name, cache_salt), out, nb)
    else:
        x, keep = _vextra(lora_name, lora_path, cache_salt, mm, prompt_embeds, False)
        r = _lib.kvc_hash_vllm_chain_extra(_enc(pythonhashseed), t, n, block_tokens, x, out,
                                           nb)
        del keep
    if r < 0:
        raise KvError(r, call="vllm_chain")
    return [bytes(out[i].b) for i in range(r)]
