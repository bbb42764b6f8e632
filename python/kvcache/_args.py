"""ctypes arguments of the kvcache package: Python values to what
client/kvcache.h takes. Internal."""
from __future__ import annotations

import ctypes
from typing import Iterable, Optional, Sequence, Tuple, Union

from . import _native

HASH_BYTES = 32

Block = int
Hash = bytes


def _enc(s: Optional[Union[str, bytes]]) -> Optional[bytes]:
    if s is None:
        return None
    return s if isinstance(s, bytes) else s.encode("utf-8")


def _blocks(bs: Iterable[int]) -> Tuple[ctypes.Array, int]:
    bs = list(bs)
    return (ctypes.c_uint64 * max(len(bs), 1))(*bs), len(bs)


def _hashes(hs: Iterable[bytes]) -> Tuple[ctypes.Array, int]:
    """An array of kvc_hash from 32-byte hashes, copied in one piece (a
    2k-token chain is 128 hashes: one memmove each cost more than the call
    to the daemon)."""
    hs = hs if type(hs) is list else list(hs)
    n = len(hs)
    if n == 0:
        return (_native.Hash * 1)(), 0
    if set(map(len, hs)) != {HASH_BYTES}:
        for i, h in enumerate(hs):
            if len(h) != HASH_BYTES:
                raise ValueError(f"hash {i}: {len(h)} bytes, not {HASH_BYTES}")
    try:
        buf = b"".join(hs)
    except TypeError:          # not bytes-like (a list of 32 ints): as bytes() takes it
        buf = b"".join(bytes(h) for h in hs)
    if len(buf) != n * HASH_BYTES:     # a memoryview of wider items
        buf = b"".join(bytes(h) for h in hs)
        if len(buf) != n * HASH_BYTES:
            raise ValueError(f"hashes: {len(buf)} bytes for {n} hashes")
    return (_native.Hash * n).from_buffer_copy(buf), n


def _hash_out(n: int) -> ctypes.Array:
    return (_native.Hash * max(n, 1))()


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
