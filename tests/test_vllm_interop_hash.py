#!/usr/bin/env python3
"""Block hashes against vLLM 0.33.0's own code (issue 25): the Python binding's
vllm_seed/vllm_block/vllm_chain, which call libkvcache's kvc_hash_vllm_*,
give, byte for byte, what vLLM computes with sha256_cbor:

  - NONE_HASH from vllm.v1.core.kv_cache_utils.init_none_hash, with
    PYTHONHASHSEED unset (vLLM's fixed default seed) and set;
  - the hashes of a real vllm.v1.request.Request whose block_hasher is
    get_request_block_hasher(...), with each kind of tagged extra key (LoRA
    name and path, multimodal items with their offsets, the cache salt,
    prompt-embeds digests) alone and all together, the prompt given at once
    and token by token;
  - single blocks against hash_block_tokens with the extra keys
    generate_block_hash_extra_keys produces;
  - the integer form against maybe_convert_block_hash.

Runs under scripts/vllm-env's python (tests/vllm_env.py); exits 77 without
it."""
import hashlib
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_env  # noqa: E402

vllm_env.reexec()

import torch  # noqa: E402
import vllm.v1.core.kv_cache_utils as kcu  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256_cbor  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.utils import tensor_data  # noqa: E402

import kvcache  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def set_seed(seed):
    if seed is None:
        os.environ.pop("PYTHONHASHSEED", None)
    else:
        os.environ["PYTHONHASHSEED"] = seed
    kcu.init_none_hash(sha256_cbor)


def vllm_request(tokens, bs, lora=None, salt=None, mm=None, embeds=None, incremental=False):
    """A real vLLM request; returns its block hashes as vLLM computed them."""
    feats = [MultiModalFeatureSpec(data=None, modality="image", identifier=ident,
                                   mm_position=PlaceholderRange(offset=off, length=n))
             for ident, off, n in (mm or [])]
    first = tokens[:bs + 3] if incremental else tokens
    req = Request(request_id="r", prompt_token_ids=list(first),
                  sampling_params=SamplingParams(max_tokens=len(tokens) + 1),
                  pooling_params=None,
                  lora_request=LoRARequest(lora[0], 7, lora[1]) if lora else None,
                  cache_salt=salt, mm_features=feats or None,
                  prompt_embeds=None if incremental else embeds,
                  block_hasher=kcu.get_request_block_hasher(bs, sha256_cbor))
    if incremental:
        for t in tokens[len(first):]:
            req.append_output_token_ids(t)
    return req, list(req.block_hashes)


def digests(embeds, bs, nblocks):
    return [hashlib.sha256(tensor_data(embeds[i * bs:(i + 1) * bs])).digest()
            for i in range(nblocks)]


def main():
    rnd = random.Random(25)
    bs = 16
    edges = [0, 1, 23, 24, 255, 256, 65535, 65536, 151642, 2**32 - 1]
    tokens = edges + [rnd.randrange(200000) for _ in range(bs * 6 + 5 - len(edges))]
    nb = len(tokens) // bs
    embeds = torch.randn(len(tokens), 8, generator=torch.Generator().manual_seed(25))
    lora = ("adapter-ü", "/models/adapters/a1")
    mm = [("img-" + "a" * 40, 3, 20), ("img-b", 40, 8), ("audio-c", 48, 16), ("img-d", 90, 30)]
    kinds = {
        "none": {},
        "lora": {"lora": lora},
        "salt": {"salt": "tenant-a"},
        "mm": {"mm": mm},
        "prompt_embeds": {"embeds": embeds},
        "all": {"lora": lora, "salt": "s" * 300, "mm": mm, "embeds": embeds},
    }
    n = 0
    for seed in (None, "0", "12345"):
        set_seed(seed)
        check(kvcache.vllm_seed(seed) == kcu.NONE_HASH,
              "NONE_HASH for PYTHONHASHSEED=%r" % seed)
        if seed is None:
            check(kvcache.vllm_seed() == kcu.NONE_HASH, "the default seed is not vLLM's")
        for name, k in kinds.items():
            for incremental in (False, True):
                if incremental and "embeds" in k:
                    continue  # prompt embeddings come with the prompt only
                req, want = vllm_request(tokens, bs, k.get("lora"), k.get("salt"),
                                         k.get("mm"), k.get("embeds"), incremental)
                check(len(want) == nb, "vLLM hashed %d blocks, not %d" % (len(want), nb))
                kw = dict(lora_name=k["lora"][0] if "lora" in k else None,
                          lora_path=k["lora"][1] if "lora" in k else None,
                          cache_salt=k.get("salt"), mm=k.get("mm"),
                          prompt_embeds=digests(embeds, bs, nb) if "embeds" in k else None)
                got = kvcache.vllm_chain(tokens, bs, seed, **kw)
                what = "%s seed=%r incremental=%s" % (name, seed, incremental)
                check(got == want, "chain %s: %s vs vLLM %s" %
                      (what, [h.hex()[:12] for h in got], [h.hex()[:12] for h in want]))
                if seed is None:
                    check(kvcache.vllm_chain(tokens, bs, **kw) == want,
                          "chain %s with the default seed argument" % what)
                # Block by block, against hash_block_tokens with vLLM's keys.
                parent = kvcache.vllm_seed(seed)
                for i in range(nb):
                    s, e = i * bs, (i + 1) * bs
                    keys, _ = kcu.generate_block_hash_extra_keys(req, s, e, 0)
                    ref = kcu.hash_block_tokens(sha256_cbor, None if i == 0 else want[i - 1],
                                                tokens[s:e], keys)
                    h = kvcache.vllm_block(parent, tokens[s:e], start=s, **kw)
                    check(h == ref == want[i], "block %d of %s" % (i, what))
                    # vLLM's int form (its KV events' default).
                    check(int.from_bytes(h[-8:], "big") == kcu.maybe_convert_block_hash(ref),
                          "int form of block %d of %s" % (i, what))
                    parent = h
                n += 1
    # Old behaviour only on request: vLLM <= 0.30's untagged keys differ.
    set_seed(None)
    plain = kvcache.vllm_chain(tokens, bs)
    check(kvcache.vllm_chain(tokens, bs, legacy_keys=True) == plain,
          "legacy_keys without keys changes the hashes")
    check(kvcache.vllm_chain(tokens, bs, cache_salt="x", legacy_keys=True) !=
          kvcache.vllm_chain(tokens, bs, cache_salt="x"), "legacy_keys hashes the tagged salt")
    # A LoRA without its path is refused: vLLM always hashes the path.
    try:
        kvcache.vllm_chain(tokens, bs, lora_name="a")
        check(False, "a LoRA name without a path was accepted")
    except kvcache.KvError:
        pass
    # Fewer prompt-embeds digests than blocks: refused, not read past.
    try:
        kvcache.vllm_chain(tokens, bs, prompt_embeds=digests(embeds, bs, nb - 1))
        check(False, "too few prompt-embeds digests were accepted")
    except kvcache.KvError:
        pass
    # Hostile descriptions are refused (-EINVAL), not read past or wrapped.
    pe = digests(embeds, bs, nb)
    for what, call in [
            ("a multimodal item without an identifier",
             lambda: kvcache.vllm_chain(tokens, bs, mm=[(None, 0, 4)])),
            ("a multimodal item past 2**63",
             lambda: kvcache.vllm_chain(tokens, bs, mm=[("x", 2**63, 1)])),
            ("a multimodal item whose end wraps",
             lambda: kvcache.vllm_chain(tokens, bs, mm=[("x", 2**62, 2**63)])),
            ("a block start off the block grid with prompt embeddings",
             lambda: kvcache.vllm_block(kcu.NONE_HASH, tokens[:bs], start=3, prompt_embeds=pe)),
            ("a block past the prompt-embeds digests",
             lambda: kvcache.vllm_block(kcu.NONE_HASH, tokens[:bs], start=bs * nb,
                                        prompt_embeds=pe))]:
        try:
            call()
            check(False, "accepted: " + what)
        except kvcache.KvError:
            pass
    if failures:
        print("%d failures" % len(failures), file=sys.stderr)
        return 1
    print("%d chains of %d blocks agree with vLLM %s" % (n, nb, __import__("vllm").__version__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
