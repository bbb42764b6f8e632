"""Connections to kvcached: Connection, Pool, CudaBlock, connect()."""
from __future__ import annotations

import ctypes
import errno as _errno
import itertools as _itertools
from typing import Any, List, Optional, Sequence, Tuple, Union

from . import _native
from ._args import HASH_BYTES, Block, Hash, _blocks, _enc, _hashes, _tokens
from ._native import lib as _lib
from .errors import ESTALE, KvError

def default_socket() -> str:
    """The daemon's socket path as the daemon, kvctl and the library resolve
    it: $KVCACHED_SOCKET, else /run/kvcached/kvcached.sock for root, else
    $XDG_RUNTIME_DIR/kvcached.sock."""
    buf = ctypes.create_string_buffer(4096)
    r = _lib.kvc_default_socket(buf, len(buf))
    if r < 0:
        raise KvError(r, call="default_socket")
    return buf.value.decode()


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


# Where a lookup found a block (Connection.lookup(tiers=True); enum kvc_tier).
TIER_G1 = 0
TIER_G2 = 1
TIER_G3 = 2
TIER_G4 = 3
TIER_UNKNOWN = 255


def _timeout(ms: Optional[int]) -> int:
    """A deadline in ms as kvc_options.timeout_ms takes it (0: the
    default; negative: none)."""
    if ms is None:
        return 0
    if isinstance(ms, bool) or not isinstance(ms, int):
        raise TypeError(f"timeout_ms {ms!r}: an int (milliseconds) or None")
    return max(min(ms, 2**31 - 1), -1)


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
                 client_name: Optional[str] = None, cuda_device: Optional[int] = None,
                 timeout_ms: Optional[int] = None):
        self._c = ctypes.c_void_p()
        opt = _native.Options(_enc(namespace), _enc(client_name),
                              0 if cuda_device is None else cuda_device + 1,
                              _timeout(timeout_ms))
        r = _lib.kvc_connect(_enc(socket), ctypes.byref(opt), ctypes.byref(self._c))
        if r < 0:
            raise KvError(r, call="connect")
        self.socket = socket or default_socket()
        self.namespace = namespace
        self.timeout_ms = timeout_ms
        self.pools: dict = {}

    def set_timeout(self, ms: Optional[int]) -> None:
        """The deadline of this connection's calls from now on, in
        milliseconds: None or 0 the library's default (60 s, or
        $KVCACHE_TIMEOUT_MS), negative none. A call past it raises KvError
        with code ``ETIMEDOUT`` and the connection is dropped (the daemon
        releases what it held; the next call reconnects, ``restarts``
        grows), see client/kvcache.h, "Deadlines"."""
        self._check(_lib.kvc_set_timeout(self._h(), _timeout(ms)), "set_timeout")
        self.timeout_ms = ms

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

    def lookup(self, pool: Union[Pool, int], chain: Sequence[Hash], tiers: bool = False):
        """The longest cached prefix of a hash chain (head first), each block
        with a reference taken for this connection: a list of blocks. With
        ``tiers=True``, ``(blocks, tiers)``: tiers[i] says where blocks[i]
        came from, ``TIER_G1`` (in device memory already), ``TIER_G2`` /
        ``TIER_G3`` (promoted from the host / disk tier for this lookup),
        ``TIER_G4`` (fetched from the cluster tier), ``TIER_UNKNOWN`` (a
        daemon that does not say)."""
        h, n = _hashes(chain)
        if n == 0:
            return ([], []) if tiers else []
        out = (ctypes.c_uint64 * n)()
        if not tiers:
            k = self._check(_lib.kvc_lookup(self._h(), int(pool), h, n, out), "lookup")
            return list(out[:k])
        t = (ctypes.c_uint8 * n)()
        k = self._check(_lib.kvc_lookup_tiers(self._h(), int(pool), h, n, out, t), "lookup")
        return list(out[:k]), list(t[:k])

    def lookup_many(self, pool: Union[Pool, int], chains: Sequence[Any],
                    tiers: bool = False) -> list:
        """lookup() of several chains in one call (``kvc_lookup_many()``: the
        lookups pipelined, one deadline for them all): a list of what
        lookup() answers for each chain, in order. A chain is what lookup()
        takes, or ``bytes`` holding its hashes concatenated (a multiple of
        32 bytes). Raises KvError when the call fails as a whole (nothing is
        held then), or with the first error when the daemon refuses a
        lookup (the blocks the others found are released first)."""
        pieces, lens = [], []
        for c in chains:
            if type(c) is bytes:
                if len(c) % HASH_BYTES:
                    raise ValueError(f"a packed chain of {len(c)} bytes, not a multiple of "
                                     f"{HASH_BYTES}")
                pieces.append(c)
                lens.append(len(c) // HASH_BYTES)
                continue
            c = c if type(c) is list else list(c)
            buf = None
            if set(map(len, c)) <= {HASH_BYTES}:
                try:
                    buf = b"".join(c)
                except TypeError:
                    pass
            if buf is None or len(buf) != len(c) * HASH_BYTES:
                # Not all bytes of 32 (a bad length, a list of ints): as
                # lookup() takes it, with its message.
                buf = bytes(_hashes(c)[0])[:len(c) * HASH_BYTES]
            pieces.append(buf)
            lens.append(len(c))
        nc = len(lens)
        if nc == 0:
            return []
        total = sum(lens)
        buf = pieces[0] if nc == 1 else b"".join(pieces)
        n = (ctypes.c_size_t * nc)(*lens)
        out = (ctypes.c_uint64 * max(total, 1))()
        t = (ctypes.c_uint8 * max(total, 1))() if tiers else None
        found = (ctypes.c_int * nc)()
        self._check(_lib.kvc_lookup_many(self._h(), int(pool), buf, n, nc, out, t, found),
                    "lookup")
        res, off, err = [], 0, 0
        for i in range(nc):
            k = found[i]
            if k < 0:
                err = err or k
                k = 0
            b = out[off:off + k] if k else []
            res.append((b, t[off:off + k] if k else []) if tiers else b)
            off += lens[i]
        if err:
            held = [x for r in res for x in (r[0] if tiers else r)]
            if held:
                try:
                    self.release(held)
                except KvError:
                    pass
            msg = _lib.kvc_last_error(self._c) if self._c else None
            raise KvError(err, (msg or b"").decode("utf-8", "replace"), "lookup")
        return res

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
            client_name: Optional[str] = None, cuda_device: Optional[int] = None,
            timeout_ms: Optional[int] = None) -> Connection:
    """Connects to kvcached and says Hello. socket: None for default_socket();
    namespace: None for the caller's own ("uid-<uid>"), or one the operator
    granted; client_name: shown by ``kvctl clients``. cuda_device (cuda
    backend): None maps each device's blocks for the GPU they live on, found
    by UUID whatever CUDA_VISIBLE_DEVICES says and whatever context is
    current; an ordinal of this process gives that GPU access too (peer
    access; ``ENODEV`` without it). timeout_ms: each call's deadline
    (``Connection.set_timeout()``; None: the library's default, 60 s), the
    connect and Hello included. Raises KvError (``EACCES`` for a namespace
    this uid may not open, ``ETIMEDOUT`` for a daemon that did not answer in
    time)."""
    return Connection(socket, namespace, client_name, cuda_device, timeout_ms)
