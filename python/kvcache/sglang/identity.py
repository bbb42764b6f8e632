"""Which kvcached pool an SGLang instance's pages go to, and under which key.

A pool's identity is everything that makes two instances' page bytes differ
and nothing else (docs/sglang.md): the model (SGLang's ``model_name``, or the
operator's ``model`` in the extra config for weights served under different
paths), the host pool's class (MHA, MLA, K-only), its KV dtype and geometry
(layers and the layer range of a pipeline stage, heads, head dims, MLA's
ranks), its layout (``layer_first``, ``page_first``, ``page_first_direct``),
the page size, the shard (TP rank and size for MHA; MLA pages are the same on
every TP rank, as SGLang's own backends treat them), the context-parallel
shard, and how a page is laid out in a kvcached block (``v1``: the pieces of
the host pool's ``get_page_buffer_meta`` in its order; ``flat``: SGLang's
flat data page of the older calls). Two instances agree on all of it exactly
when they can read each other's pages; the name and the layout bytes given to
``register_pool`` carry it, so kvcached keeps the others apart (a pool of the
same name with other bytes is refused, EEXIST).

Imports nothing from SGLang, so it is checked without it.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, Tuple

import kvcache

# Host pool attributes that shape a page's bytes, where the class has them.
_GEOMETRY = ("layer_num", "start_layer", "end_layer", "head_num", "head_dim", "v_head_dim",
             "kv_lora_rank", "qk_rope_head_dim", "kv_cache_dim", "override_kv_cache_dim",
             "dsa_kv_cache_store_fp8", "head_group_num", "dcp_size", "dcp_rank")


def dtype_name(dt) -> str:
    s = str(dt).replace("torch.", "")
    return {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32",
            "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2", "uint8": "u8"}.get(s, s)


def describe(cfg: Dict[str, Any], host: Dict[str, Any], fmt: str, pieces: Tuple[int, ...],
             model: str) -> Dict[str, Any]:
    """The identity as a dict. cfg: HiCacheStorageConfig's fields; host: the
    host pool's class name, layout, page_size, dtype and _GEOMETRY values;
    fmt: "v1" or "flat"; pieces: the byte sizes of one page's pieces in
    block order (v1) or (page bytes,) (flat)."""
    mla = bool(cfg.get("is_mla_model"))
    d = {
        "engine": "sglang",
        "model": model,
        "pool_class": host.get("class", ""),
        "mla": mla,
        "dtype": dtype_name(host.get("dtype", "")),
        "layout": host.get("layout", ""),
        "page_size": int(host.get("page_size", 0)),
        "format": fmt,
        "pieces": list(pieces),
        "pp": [int(cfg.get("pp_rank", 0)), int(cfg.get("pp_size", 1))],
        "cp": [int(cfg.get("attn_cp_rank", 0)), int(cfg.get("attn_cp_size", 1))],
        "dcp": [int(cfg.get("dcp_rank", 0)), int(cfg.get("dcp_size", 1))],
    }
    if not mla:
        # MHA heads are split across TP ranks: each rank's pages are its own.
        d["tp"] = [int(cfg.get("tp_rank", 0)), int(cfg.get("tp_size", 1))]
        if cfg.get("should_split_heads"):
            d["tp_lcm"] = int(cfg.get("tp_lcm_size") or 0)
    for k in _GEOMETRY:
        v = host.get(k)
        if v is not None:
            d[k] = v if isinstance(v, (bool, str)) else int(v)
    return d


def pool_identity(cfg: Dict[str, Any], host: Dict[str, Any], fmt: str,
                  pieces: Tuple[int, ...], model: str) -> Tuple[str, bytes]:
    """(pool name, layout bytes) for register_pool: the name readable in
    ``kvctl pools`` and unique per identity (a digest of it), the layout
    bytes the whole identity as canonical JSON."""
    d = describe(cfg, host, fmt, pieces, model)
    lay = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
    h = hashlib.sha256(lay).hexdigest()[:12]
    base = os.path.basename(model.rstrip("/")) or "model"
    shard = "mla" if d["mla"] else "tp%d" % d["tp"][0]
    name = f"sglang/{base[:30]}/{d['layout'] or 'pool'}/{shard}/{h}"
    return name, lay


def page_key(key: str) -> bytes:
    """kvcached's 32-byte hash for one of SGLang's page keys (the hex SHA-256
    of a page chained to its prefix that ``get_storage_hash_str`` makes, or
    any other string): the key's own 32 bytes when it is 64 hex digits, else
    its SHA-256 under a domain tag. The pool keeps models apart; the key
    keeps prefixes apart."""
    if isinstance(key, bytes):
        key = key.decode("utf-8", "surrogateescape")
    if len(key) == 2 * kvcache.HASH_BYTES:
        try:
            return bytes.fromhex(key)
        except ValueError:
            pass
    return hashlib.sha256(b"kvcached/sglang-page-key\0" + key.encode("utf-8",
                                                                      "surrogateescape")).digest()
