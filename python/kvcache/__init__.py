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

Deadlines: every call has one (``connect(timeout_ms=...)``,
``Connection.set_timeout()``; 60 s by default): a daemon that does not answer
in time (stopped, wedged) makes the call raise ``KvError`` with code
``kvcache.ETIMEDOUT`` (``-errno.ETIMEDOUT``) and the connection is dropped;
the next call reconnects, as after a daemon restart.

Covered: every function of client/kvcache.h — connect/close/restarts/
set_timeout,
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

Layout: this module only hands names on; the binding lives in errors.py
(KvError, the codes), _conn.py (Connection, Pool, CudaBlock, connect),
_hash.py (block hashes), _args.py (ctypes arguments) and _native.py (the
library and its declarations).
"""
from __future__ import annotations

from . import _native  # noqa: F401  (kvcache._native: tests/test_py_structs.py)
from ._args import HASH_BYTES, Block, Hash
from ._conn import (TIER_G1, TIER_G2, TIER_G3, TIER_G4, TIER_UNKNOWN,  # noqa: F401
                    Connection, CudaBlock, Pool, _is_device_pointer, connect,
                    default_socket)
from ._hash import (SHA256, XXH3_128, MmItem, hash_block, hash_chain, hash_seed,
                    vllm_block, vllm_chain, vllm_seed)
from .errors import (E2BIG, EACCES, EAGAIN, ECONFIG, EEXIST, EINTERNAL, EINVAL, EIO,
                     ENOENT, ENOSPC, EPERM, EPROTO, EQUOTA, ESHUTDOWN, ESTALE, ESTATE,
                     ETIMEDOUT, EVERSION, KvError, strerror)

__all__ = [
    "KvError", "Connection", "Pool", "CudaBlock", "connect", "default_socket", "strerror",
    "hash_seed", "hash_block", "hash_chain", "vllm_seed", "vllm_block", "vllm_chain",
    "SHA256", "XXH3_128", "HASH_BYTES",
    "EINVAL", "ENOSPC", "ENOENT", "ESTALE", "EPERM", "EPROTO", "EVERSION", "EEXIST", "E2BIG",
    "EINTERNAL", "ESTATE", "ESHUTDOWN", "EIO", "ECONFIG", "EACCES", "EQUOTA", "EAGAIN",
    "ETIMEDOUT", "TIER_G1", "TIER_G2", "TIER_G3", "TIER_G4", "TIER_UNKNOWN",
]
