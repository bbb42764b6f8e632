"""Block hashes: kvcached's own chain (hash_seed, hash_block, hash_chain)
and vLLM's (vllm_seed, vllm_block, vllm_chain), computed by libkvcache."""
from __future__ import annotations

import ctypes
from typing import List, Optional, Sequence, Tuple, Union

from . import _native
from ._args import Hash, _enc, _hash_out, _hashes, _tokens
from ._native import lib as _lib
from .errors import KvError

SHA256 = 0     # the default hash: prompts are adversarial input
XXH3_128 = 1   # opt-in, for trusted deployments


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
