"""Which kvcached pool an engine's blocks go to, and the keys they go
under: both sides of the connector compute the same pool from vLLM's
configuration, so engines whose K/V bytes would agree share one pool and
engines whose bytes would differ never do."""
from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Tuple

from . import _compat  # noqa: F401  (the vLLM release check, before vLLM's modules)

from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    generate_block_hash_extra_keys, to_event_extra_keys)
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec,
    compute_layer_kv_cache_shape_bytes)

import kvcache  # noqa: E402

from .datapath import physical_order  # noqa: E402

log = logging.getLogger("kvcache.vllm")


def kv_keys(hs) -> list:
    """kv_key of each of a list of vLLM's block hashes (bytes of 32 taken
    as they are: vLLM's default)."""
    hs = hs if type(hs) is list else list(hs)
    # vLLM's default (sha256, sha256_cbor): every hash bytes of 32. An
    # engine hashes every block with one function, so its hashes are all
    # of one type and one length: the first's, and the joined length (one
    # pass in C), say so.
    if not hs:
        return hs
    if type(hs[0]) is bytes and len(hs[0]) == 32:
        try:
            if len(b"".join(hs)) == 32 * len(hs):
                return hs
        except TypeError:
            pass
    return [h if type(h) is bytes and len(h) == 32 else kv_key(h) for h in hs]


def kv_keys_packed(hs):
    """(kv_keys(hs), the keys concatenated): what Connection.lookup_many
    takes as a chain. vLLM's default hashes (bytes of 32) are their own
    keys: one join, no other pass over them (7 -> 2.5 us for a 2k-token
    prompt). An engine hashes every block with one function, so its hashes
    are all of one type and one length: the first's, and the joined
    length, say whether they are 32 bytes each."""
    hs = hs if type(hs) is list else list(hs)
    if hs and type(hs[0]) is bytes and len(hs[0]) == kvcache.HASH_BYTES:
        try:
            buf = b"".join(hs)
        except TypeError:
            buf = None
        if buf is not None and len(buf) == kvcache.HASH_BYTES * len(hs):
            return hs, buf
    keys = kv_keys(hs)
    return keys, b"".join(keys)


def kv_key(h) -> bytes:
    """kvcached's 32-byte key for one of vLLM's block hashes: the hash itself
    (sha256, sha256_cbor: vLLM's default), else its SHA-256 (xxhash)."""
    h = bytes(h)
    if len(h) == kvcache.HASH_BYTES:
        return h
    return hashlib.sha256(b"kvcached/vllm-block-hash\0" + h).digest()


_NONE_KEYS: list = []


def _none_event_keys():
    """to_event_extra_keys([None]) (vLLM's answer for one block without
    extra keys) when it is a one-element list of None, else None; asked
    once."""
    if not _NONE_KEYS:
        r = to_event_extra_keys([None])
        _NONE_KEYS.append([None] if r == [None] and type(r) is list else None)
    return _NONE_KEYS[0]


def event_meta(req, a: int, b: int, bs: int):
    """What vLLM's own BlockStored says of blocks [a, b) of req besides
    their hashes and tokens, made by vLLM's own functions as its block pool
    makes it (vllm/v1/core/block_pool.py cache_full_blocks): (lora_name,
    lora_id, extra_keys), extra_keys one entry per block, untagged
    (to_event_extra_keys). kvcached's events then carry the same."""
    lr = getattr(req, "lora_request", None)
    if (lr is None and not getattr(req, "mm_features", None) and not req.cache_salt
            and getattr(req, "prompt_embeds", None) is None):
        # Nothing vLLM would key a block by besides its tokens: every
        # block's extra keys are None (the scheduler's cost: 2k-token
        # prompts would call vLLM's function 128 times a request), and
        # what vLLM's to_event_extra_keys makes of a None, asked once, is
        # each block's entry (a list comprehension over 128 Nones was 5 us
        # a request).
        if b <= a:
            return None, None, to_event_extra_keys([])
        one = _none_event_keys()
        return None, None, (one * (b - a) if one is not None
                            else to_event_extra_keys([None] * (b - a)))
    keys, mm = [], 0
    for i in range(a, b):
        k, mm = generate_block_hash_extra_keys(req, i * bs, (i + 1) * bs, mm)
        keys.append(k)
    return (lr.name if lr else None, lr.adapter_id if lr else None,
            to_event_extra_keys(keys))


def dtype_name(dt) -> str:
    s = str(dt).replace("torch.", "")
    return {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32",
            "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2", "uint8": "u8"}.get(s, s)


def tp_rank_size() -> Tuple[int, int]:
    try:
        from vllm.distributed.parallel_state import (get_tensor_model_parallel_rank,
                                                     get_tensor_model_parallel_world_size)
        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    except Exception:
        return 0, 1


def _digest(x) -> str:
    """A short digest of a JSON-able value (keys sorted, anything else by
    str): what the layout bytes carry where the value itself is long."""
    j = json.dumps(x, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(j.encode()).hexdigest()[:16]


def _files_digest(path: str) -> str:
    """The model folder's files as they are now: name, size and mtime of
    each (weights rewritten in place change it; hashing gigabytes of
    weights at every start would not be worth it). Engines started from the
    same folder agree; a copy elsewhere does not unless it kept the mtimes
    (set ``model`` to share between copies)."""
    out = []
    try:
        with os.scandir(path) as it:
            for e in it:
                if e.name.startswith(".") or not e.is_file():
                    continue
                st = e.stat()
                out.append((e.name, st.st_size, st.st_mtime_ns))
    except OSError as e:
        return "unreadable:" + type(e).__name__
    return _digest(sorted(out))


# hf_config keys that change K (rope) or which blocks a layer keeps
# (windows); any key naming rope or rotary is taken too.
_ROPE_KEYS = ("max_position_embeddings", "original_max_position_embeddings", "head_dim",
              "partial_rotary_factor", "sliding_window", "sliding_window_pattern",
              "use_sliding_window", "max_window_layers", "layer_types",
              "global_attn_every_n_layers", "no_rope_layers", "interleaved_sliding_window")
# rope scalings whose frequencies depend on the context length vLLM runs.
_LEN_DEPENDENT_ROPE = ("dynamic", "longrope", "su")


def _rope(hf) -> dict:
    d = hf.to_dict() if hasattr(hf, "to_dict") else dict(vars(hf))
    return {k: v for k, v in d.items()
            if k in _ROPE_KEYS or "rope" in k.lower() or "rotary" in k.lower()}


def kv_identity(vllm_config, extra: dict, spec, layer_names) -> dict:
    """Everything besides the tensors' geometry that changes the K/V bytes
    an engine writes for a token chain, and nothing that does not:

    - the weights: ``model`` from the extra config when set (the operator's
      name for the exact weights: engines serving them from different
      paths share through it), else the model vLLM was given with its
      revision and, for a local folder, a digest of its files;
    - rope and its scaling, sliding windows (the text config vLLM runs
      with, overrides included), and the context length where the rope
      scaling depends on it;
    - the KV cache dtype as configured (fp8 variants) and how its scales
      are made, the quantization method and its config;
    - head geometry, the layer names (pipeline stages hold other layers),
      TP size (the pool name carries the rank), decode context parallelism.

    Raises ValueError for a configuration whose K/V bytes are this engine's
    own (fp8 KV scales computed at run time), which no other engine may
    load."""
    mc = vllm_config.model_config
    cc = vllm_config.cache_config
    pc = vllm_config.parallel_config
    if extra.get("model"):
        weights = {"name": str(extra["model"])}
    else:
        model = str(mc.model)
        weights = {"name": model, "revision": getattr(mc, "revision", None)}
        if os.path.isdir(model):
            weights["files"] = _files_digest(model)
    hf = getattr(mc, "hf_text_config", None) or getattr(mc, "hf_config", None)
    rope = _rope(hf) if hf is not None else {}
    scaling = rope.get("rope_scaling") or rope.get("rope_parameters") or {}
    if isinstance(scaling, dict) and any(
            str(v).lower() in _LEN_DEPENDENT_ROPE for k, v in scaling.items()
            if k in ("type", "rope_type")):
        rope["__max_model_len"] = mc.max_model_len
    cache_dtype = str(getattr(cc, "cache_dtype", "auto"))
    if cache_dtype == "fp8":          # vLLM's "fp8" is e4m3
        cache_dtype = "fp8_e4m3"
    if cache_dtype.startswith("fp8") and getattr(cc, "calculate_kv_scales", False):
        raise ValueError("KvcachedConnector: calculate_kv_scales makes this engine's fp8 KV "
                         "scales its own (computed from its first batch), so no other engine "
                         "may load its blocks; use the checkpoint's scales")
    hfq = getattr(getattr(mc, "hf_config", None), "quantization_config", None)
    quant = {"method": getattr(mc, "quantization", None),
             "config": _digest(hfq) if hfq else None}
    geom = {"kind": type(spec).__name__, "kv_heads": getattr(spec, "num_kv_heads", None),
            "head_size": getattr(spec, "head_size", None),
            "head_size_v": getattr(spec, "head_size_v", None),
            "window": getattr(spec, "sliding_window", None),
            "layers": _digest(list(layer_names))}
    par = {"tp": pc.tensor_parallel_size,
           "dcp": getattr(pc, "decode_context_parallel_size", 1),
           "pcp": getattr(pc, "prefill_context_parallel_size", 1)}
    return {"weights": _digest(weights), "rope": _digest(rope), "kv_dtype": cache_dtype,
            "quant": _digest(quant), "geom": geom, "par": par}


def check_groups(kv_cache_config) -> list:
    """The KV cache groups' specs, after checking that the connector can
    keep every group's blocks right (docs/vllm.md, "Hybrid models"): full
    attention and sliding-window groups of one block size (vLLM's hybrid
    allocator with a Gemma-2-like model). Raises ValueError, naming what
    it found, for anything else (Mamba and other state groups, chunked
    local attention, cross attention, groups of different block sizes or
    with trailing tokens retained below the window): blocks of such groups
    are not what a token chain's hash says they are, so sharing them could
    hand an engine KV it would not compute."""
    groups = list(kv_cache_config.kv_cache_groups)
    kinds = [type(g.kv_cache_spec).__name__ for g in groups]
    if not groups:
        raise ValueError("KvcachedConnector: no KV cache groups")
    for g in groups:
        sp = g.kv_cache_spec
        # One group: any full-attention spec (with the hybrid allocator off
        # vLLM folds windows into it and keeps every block). Several: the
        # plain kinds whose managers keep or drop whole head blocks only.
        if len(groups) == 1:
            ok = isinstance(sp, FullAttentionSpec) or type(sp) is SlidingWindowSpec
        else:
            ok = type(sp) in (FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec)
        ok = ok and not getattr(sp, "non_causal", False)
        if not ok:
            raise ValueError(
                "KvcachedConnector supports models whose KV cache groups are full-attention "
                f"or sliding-window attention; this one has {kinds} (Mamba/SSM state, "
                "chunked local, cross and non-causal attention are not supported: their "
                "blocks are not keyed by the token chain alone)")
        if type(sp) is SlidingWindowSpec and getattr(sp, "extra_retained_tokens", 0):
            raise ValueError("KvcachedConnector: a sliding-window group retains "
                             f"{sp.extra_retained_tokens} tokens below its window (multi-"
                             "module speculative decoding); not supported")
        if getattr(g, "enable_kv_transfer", True) is False:
            raise ValueError(f"KvcachedConnector: KV cache group {kinds} has KV transfer "
                             "disabled; a hit would leave that group's blocks unloaded")
    sizes = {g.kv_cache_spec.block_size for g in groups}
    hbs = getattr(kv_cache_config, "hash_block_size", None)
    if len(sizes) != 1 or (hbs is not None and hbs not in sizes):
        raise ValueError("KvcachedConnector: KV cache groups of block sizes "
                         f"{[g.kv_cache_spec.block_size for g in groups]} (hash block size "
                         f"{hbs}); it needs one block size, the one vLLM hashes by")
    return groups


def groups_identity(groups) -> str:
    """What every group's pool carries of all the groups: each group's
    kind, window and layers. A layer's K/V depends on every layer below it,
    so two engines whose grouping differs anywhere (another window, layers
    split otherwise) share no group's blocks."""
    return _digest([[type(g.kv_cache_spec).__name__,
                     getattr(g.kv_cache_spec, "sliding_window", None),
                     list(g.layer_names)] for g in groups])


def pool_specs(vllm_config, kv_cache_config, extra: dict, tp_rank: int) -> list:
    """One PoolSpec per KV cache group (check_groups first)."""
    groups = check_groups(kv_cache_config)
    return [PoolSpec(vllm_config, kv_cache_config, extra, tp_rank, group=i)
            for i in range(len(groups))]


class PoolSpec:
    """The kvcached pool of one model, layout, TP rank and KV cache group,
    as both sides compute it from vLLM's configuration: same name, block
    size and layout bytes in every engine that can share the blocks,
    different ones where the bytes would differ. A kvcached block holds one
    vLLM block of every layer of the group."""

    def __init__(self, vllm_config, kv_cache_config, extra: dict, tp_rank: int, group: int = 0):
        groups = check_groups(kv_cache_config)
        self.group = group
        self.ngroups = len(groups)
        spec = groups[group].kv_cache_spec
        # Tokens a sliding-window group attends to (None: full attention).
        self.window = spec.sliding_window if type(spec) is SlidingWindowSpec else None
        self.layer_names = list(groups[group].layer_names)
        self.block_size = spec.block_size
        shape = compute_layer_kv_cache_shape_bytes(spec, 1)    # (1, H, N, C bytes)
        self.layer_bytes = int(shape[1] * shape[2] * shape[3])
        self.order, layout_name = None, None
        try:
            from vllm.config.cache import _layout_from_name
            name = (getattr(kv_cache_config, "kv_cache_layout", None)
                    or vllm_config.cache_config.kv_cache_layout)
            if name:
                lay = _layout_from_name(name)
                self.order = physical_order(lay.layer_view_order, shape[1:])
                layout_name = lay.name
        except Exception as e:
            log.warning("kvcached: cannot tell vLLM's KV cache layout (%s)", e)
        if self.order is None:
            log.warning("kvcached: vLLM's KV cache layout is not resolved here; assuming NHD "
                        "(a worker on another layout finds no blocks this side looks up)")
        pc = vllm_config.parallel_config
        self.model = str(extra.get("model") or vllm_config.model_config.model)
        self.tp = (tp_rank, pc.tensor_parallel_size)
        self.dtype = dtype_name(spec.dtype)
        self.block_bytes = self.layer_bytes * len(self.layer_names)
        self._layout_name = layout_name
        self.kv_id = kv_identity(vllm_config, extra, spec, self.layer_names)
        if len(groups) > 1:
            # Hybrid (vLLM's hybrid allocator): the group and the whole
            # grouping; a single group's identity stays as it was.
            self.kv_id["group"] = {"index": group, "of": groups_identity(groups)}

    def desc(self, order: str) -> Tuple[str, bytes]:
        d = {"engine": "vllm", "model": self.model, "dtype": self.dtype,
             "block_size": self.block_size, "layers": len(self.layer_names),
             "layer_bytes": self.layer_bytes, "order": order, "tp": list(self.tp),
             "kv": self.kv_id}
        lay = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
        h = hashlib.sha256(lay).hexdigest()[:12]
        base = os.path.basename(self.model.rstrip("/")) or "model"
        g = f"/g{self.group}" if self.ngroups > 1 else ""
        name = f"vllm/{base[:30]}/tp{self.tp[0]}{g}/{h}"
        return name, lay
