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
    hs = list(hs)
    arr = (_native.Hash * max(len(hs), 1))()
    for i, h in enumerate(hs):
        if len(h) != HASH_BYTES:
            raise ValueError(f"hash {i}: {len(h)} bytes, not {HASH_BYTES}")
        ctypes.memmove(arr[i].b, bytes(h), HASH_BYTES)
    return arr, len(hs)


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
