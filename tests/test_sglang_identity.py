#!/usr/bin/env python3
"""kvcache.sglang's pool identity (python/kvcache/sglang/identity.py): each
thing that makes two SGLang instances' page bytes differ gives another pool,
and nothing else does (MLA pages are the same on every TP rank); page keys
map to kvcached's 32-byte hashes. No SGLang needed: importing kvcache.sglang
must not import it."""
import sys

import kvcache
import kvcache.sglang as ks

assert "sglang" not in sys.modules, "importing kvcache.sglang imported SGLang"

CFG = {"tp_rank": 0, "tp_size": 2, "pp_rank": 0, "pp_size": 1, "attn_cp_rank": 0,
       "attn_cp_size": 1, "is_mla_model": False}
HOST = {"class": "MHATokenToKVPoolHost", "layout": "page_first", "page_size": 64,
        "dtype": "torch.bfloat16", "layer_num": 32, "start_layer": 0, "end_layer": 31,
        "head_num": 8, "head_dim": 128, "v_head_dim": 128}
PIECES = (4 << 20, 4 << 20)


def ident(cfg=None, host=None, fmt="v1", pieces=PIECES, model="meta/llama-3-8b"):
    c = dict(CFG, **(cfg or {}))
    h = dict(HOST, **(host or {}))
    return ks.pool_identity(c, h, fmt, pieces, model)


base = ident()
name, lay = base
assert name.startswith("sglang/llama-3-8b/page_first/tp0/"), name
assert ident() == base, "the identity is not deterministic"

differ = {
    "model": dict(model="meta/llama-3-8b-instruct"),
    "dtype": dict(host={"dtype": "torch.float16"}),
    "layout": dict(host={"layout": "layer_first"}),
    "page size": dict(host={"page_size": 32}),
    "layers": dict(host={"layer_num": 16}),
    "layer range (PP stage)": dict(host={"start_layer": 16, "end_layer": 47}),
    "heads": dict(host={"head_num": 4}),
    "head dim": dict(host={"head_dim": 64}),
    "v head dim": dict(host={"v_head_dim": 64}),
    "pool class": dict(host={"class": "MHATokenToKOnlyPoolHost"}),
    "TP rank": dict(cfg={"tp_rank": 1}),
    "TP size": dict(cfg={"tp_size": 4}),
    "PP rank": dict(cfg={"pp_rank": 1, "pp_size": 2}),
    "CP rank": dict(cfg={"attn_cp_rank": 1, "attn_cp_size": 2}),
    "MLA": dict(cfg={"is_mla_model": True}),
    "page format": dict(fmt="flat", pieces=(8 << 20,)),
    "pieces": dict(pieces=(2 << 20,) * 4),
}
seen = {base[0]: "base"}
for what, kw in differ.items():
    n, l2 = ident(**kw)
    assert n not in seen, f"{what}: same pool name as {seen.get(n)}"
    assert l2 != lay, f"{what}: same layout bytes"
    seen[n] = what

# MLA: the same pages on every TP rank (SGLang's own backends share them).
mla = dict(is_mla_model=True)
m0 = ident(cfg=dict(mla, tp_rank=0), host={"class": "MLATokenToKVPoolHost"})
m1 = ident(cfg=dict(mla, tp_rank=3, tp_size=4), host={"class": "MLATokenToKVPoolHost"})
assert m0 == m1, "MLA pools differ across TP ranks"
assert "/mla/" in m0[0], m0[0]

# Keys: SGLang's hex SHA-256 page keys are their own bytes; others hashed.
k = "0123456789abcdef" * 4
assert ks.page_key(k) == bytes.fromhex(k)
assert len(ks.page_key("hash0")) == kvcache.HASH_BYTES
assert ks.page_key("hash0") != ks.page_key("hash1")
assert ks.page_key("z" * 64) != ks.page_key("y" * 64)
assert "sglang" not in sys.modules
print("ok: %d identity fields checked, MLA shared across TP ranks, keys" % len(differ))
