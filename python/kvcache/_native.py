"""ctypes declarations of libkvcache (client/kvcache.h). Internal: use the
functions and classes of the kvcache package instead."""
from __future__ import annotations

import ctypes
import os

from . import _paths


class Hash(ctypes.Structure):
    _fields_ = [("b", ctypes.c_uint8 * 32)]


class Options(ctypes.Structure):
    _fields_ = [("ns", ctypes.c_char_p), ("client_name", ctypes.c_char_p),
                ("cuda_device", ctypes.c_int), ("timeout_ms", ctypes.c_int)]


class PoolDesc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("device", ctypes.c_uint32),
                ("block_bytes", ctypes.c_uint64), ("block_tokens", ctypes.c_uint32),
                ("dtype", ctypes.c_char_p), ("layout", ctypes.c_void_p),
                ("layout_len", ctypes.c_size_t)]


class HashExtra(ctypes.Structure):
    _fields_ = [("lora_id", ctypes.c_uint64), ("salt", ctypes.c_void_p),
                ("salt_len", ctypes.c_size_t), ("mm", ctypes.c_void_p),
                ("mm_len", ctypes.c_size_t)]


class VllmKeys(ctypes.Structure):
    _fields_ = [("lora_name", ctypes.c_char_p), ("cache_salt", ctypes.c_char_p)]


class VllmMm(ctypes.Structure):
    _fields_ = [("identifier", ctypes.c_char_p), ("offset", ctypes.c_uint64),
                ("length", ctypes.c_uint64)]


class VllmExtra(ctypes.Structure):
    _fields_ = [("lora_name", ctypes.c_char_p), ("lora_path", ctypes.c_char_p),
                ("cache_salt", ctypes.c_char_p), ("mm", ctypes.POINTER(VllmMm)),
                ("nmm", ctypes.c_size_t), ("prompt_embeds", ctypes.POINTER(Hash)),
                ("nprompt_embeds", ctypes.c_size_t)]


class EventKey(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("data", ctypes.c_void_p), ("len", ctypes.c_size_t),
                ("offset", ctypes.c_int64)]


class SealInfo(ctypes.Structure):
    _fields_ = [("parent", ctypes.POINTER(Hash)), ("token_ids", ctypes.POINTER(ctypes.c_uint32)),
                ("ntokens", ctypes.c_size_t), ("lora_name", ctypes.c_char_p),
                ("lora_id", ctypes.c_uint64), ("nkeys", ctypes.POINTER(ctypes.c_uint32)),
                ("keys", ctypes.POINTER(EventKey))]


def _load() -> ctypes.CDLL:
    """$KVCACHE_LIB, else the library meson built or installed with this
    package (_paths.py), else the loader's search path."""
    tried = []
    for path in (os.environ.get("KVCACHE_LIB"), _paths.LIBKVCACHE, "libkvcache.so.0"):
        if not path:
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path}: {e}")
    raise ImportError("kvcache: cannot load libkvcache (" + "; ".join(tried) + ")")


lib = _load()
_c = ctypes
_P = ctypes.POINTER
_u64p = _P(ctypes.c_uint64)
_u32p = _P(ctypes.c_uint32)
_conn = ctypes.c_void_p

for name, res, args in [
    ("kvc_default_socket", _c.c_int, [_c.c_char_p, _c.c_size_t]),
    ("kvc_connect", _c.c_int, [_c.c_char_p, _P(Options), _P(_conn)]),
    ("kvc_close", None, [_conn]),
    ("kvc_set_timeout", _c.c_int, [_conn, _c.c_int]),
    ("kvc_restarts", _c.c_uint64, [_conn]),
    ("kvc_register_pool", _c.c_int, [_conn, _P(PoolDesc)]),
    ("kvc_register_pool_model", _c.c_int, [_conn, _P(PoolDesc), _c.c_char_p]),
    ("kvc_alloc", _c.c_int, [_conn, _c.c_int, _c.c_uint32, _u64p]),
    ("kvc_seal", _c.c_int, [_conn, _c.c_int, _u64p, _P(Hash), _c.c_size_t, _u64p]),
    ("kvc_seal_tokens", _c.c_int, [_conn, _c.c_int, _u64p, _P(Hash), _c.c_size_t, _P(Hash),
                                   _u32p, _c.c_size_t, _u64p]),
    ("kvc_seal_events", _c.c_int, [_conn, _c.c_int, _u64p, _P(Hash), _c.c_size_t,
                                   _P(SealInfo), _u64p]),
    ("kvc_lookup", _c.c_int, [_conn, _c.c_int, _P(Hash), _c.c_size_t, _u64p]),
    ("kvc_lookup_tiers", _c.c_int, [_conn, _c.c_int, _P(Hash), _c.c_size_t, _u64p,
                                    _P(_c.c_uint8)]),
    ("kvc_lookup_many", _c.c_int, [_conn, _c.c_int, _c.c_char_p, _P(_c.c_size_t), _c.c_size_t,
                                   _u64p, _P(_c.c_uint8), _P(_c.c_int)]),
    ("kvc_release", _c.c_int, [_conn, _u64p, _c.c_size_t]),
    ("kvc_fork", _c.c_int, [_conn, _u64p, _c.c_size_t, _u64p]),
    ("kvc_cow", _c.c_int, [_conn, _u64p, _c.c_size_t, _u64p]),
    ("kvc_swap_out", _c.c_int, [_conn, _u64p, _c.c_size_t, _u64p]),
    ("kvc_swap_in", _c.c_int, [_conn, _c.c_uint64, _u64p, _c.c_size_t]),
    ("kvc_block_ptr", _c.c_void_p, [_conn, _c.c_uint64]),
    ("kvc_pool_block_bytes", _c.c_uint64, [_conn, _c.c_int]),
    ("kvc_last_error", _c.c_char_p, [_conn]),
    ("kvc_strerror", _c.c_char_p, [_c.c_int]),
    ("kvc_hash_seed", None, [_P(Hash)]),
    ("kvc_hash_block", _c.c_int, [_c.c_int, _P(Hash), _u32p, _c.c_size_t, _P(HashExtra),
                                  _P(Hash)]),
    ("kvc_hash_chain", _c.c_int, [_c.c_int, _u32p, _c.c_size_t, _c.c_uint32, _P(HashExtra),
                                  _P(Hash), _c.c_size_t]),
    ("kvc_hash_vllm_seed", _c.c_int, [_c.c_char_p, _P(Hash)]),
    ("kvc_hash_vllm_block", _c.c_int, [_P(Hash), _u32p, _c.c_size_t, _P(VllmKeys), _c.c_int,
                                       _P(Hash)]),
    ("kvc_hash_vllm_chain", _c.c_int, [_c.c_char_p, _u32p, _c.c_size_t, _c.c_uint32,
                                       _P(VllmKeys), _P(Hash), _c.c_size_t]),
    ("kvc_hash_vllm_block_extra", _c.c_int, [_P(Hash), _u32p, _c.c_size_t, _c.c_size_t,
                                             _P(VllmExtra), _P(Hash)]),
    ("kvc_hash_vllm_chain_extra", _c.c_int, [_c.c_char_p, _u32p, _c.c_size_t, _c.c_uint32,
                                             _P(VllmExtra), _P(Hash), _c.c_size_t]),
]:
    f = getattr(lib, name)
    f.restype = res
    f.argtypes = args
