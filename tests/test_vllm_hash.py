#!/usr/bin/env python3
"""vLLM-compatible block hashes, the compatibility form with vLLM <= 0.30's
untagged extra keys: kvc_hash_vllm_seed/block/chain (through tests/vllm_hash)
against a reference written here from that vLLM's definition with cbor2 and
hashlib (vLLM 0.31 and later, the default: tests/test_vllm_interop_hash.py,
against vLLM's own code):

  vllm/utils/hashing.py           sha256_cbor(x) = sha256(cbor2.dumps(x, canonical=True))
  vllm/v1/core/kv_cache_utils.py  init_none_hash: NONE_HASH = sha256_cbor(PYTHONHASHSEED)
                                  hash_block_tokens: sha256_cbor((parent or NONE_HASH,
                                      tuple(tokens), extra_keys))
                                  generate_block_hash_extra_keys: extra_keys =
                                      tuple([lora_name] + [cache_salt if first block])
                                      or None

The vectors cover every CBOR head size a token id, a string length and an
array length can take, LoRA names and salts, and several seeds."""
import hashlib
import os
import random
import subprocess
import sys

import cbor2

TOOL = os.environ["VLLM_HASH_BIN"]


def sha256_cbor(x):
    return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()


def reference(seed, block_tokens, tokens, lora=None, salt=None):
    none_hash = sha256_cbor(seed)
    parent, out = none_hash, []
    for i in range(len(tokens) // block_tokens):
        extra = ([lora] if lora is not None else []) + ([salt] if salt and i == 0 else [])
        parent = sha256_cbor((parent, tuple(tokens[i * block_tokens:(i + 1) * block_tokens]),
                              tuple(extra) if extra else None))
        out.append(parent)
    return none_hash, out


def ours(seed, block_tokens, tokens, lora=None, salt=None):
    p = subprocess.run([TOOL, seed, str(block_tokens), "-" if lora is None else lora,
                        "-" if salt is None else salt, ",".join(map(str, tokens))],
                       capture_output=True, text=True, check=True)
    rows = [line.split() for line in p.stdout.splitlines()]
    seed_hash = bytes.fromhex(rows[0][1])
    chain = [bytes.fromhex(h) for w, h in rows if w == "chain"]
    block = [bytes.fromhex(h) for w, h in rows if w == "block"]
    assert chain == block, "chain and block-by-block disagree"
    return seed_hash, chain


def main():
    rnd = random.Random(1234)
    edges = [0, 1, 23, 24, 255, 256, 65535, 65536, 151642, 2**32 - 1]
    cases = [
        ("0", 4, edges[:8]),
        ("0", 1, edges),
        ("42", 16, [rnd.randrange(50000) for _ in range(16 * 5 + 7)]),
        ("", 16, list(range(48))),
        ("12345", 24, [rnd.randrange(2**32) for _ in range(24 * 3)]),
        # 24 and 256 tokens per block: the array head's 1- and 2-byte forms.
        ("7", 256, [rnd.randrange(200000) for _ in range(512)]),
        ("0", 16, [1, 2, 3]),            # no full block
        ("0", 16, []),
    ]
    names = [None, "adapter", "x" * 23, "y" * 24, "z" * 300, "lora-ü"]
    salts = [None, "", "tenant-a", "s" * 70000]
    n = 0
    for seed, bt, tokens in cases:
        for lora in names:
            for salt in salts:
                if (lora, salt) != (None, None) and rnd.random() < 0.6:
                    continue
                ref = reference(seed, bt, tokens, lora, salt)
                got = ours(seed, bt, tokens, lora, salt)
                if ref != got:
                    print(f"MISMATCH seed={seed!r} block_tokens={bt} tokens={tokens[:8]}... "
                          f"lora={lora!r} salt={(salt or '')[:16]!r}\n"
                          f"  reference {[h.hex()[:16] for h in ref[1]]} seed {ref[0].hex()}\n"
                          f"  kvcache   {[h.hex()[:16] for h in got[1]]} seed {got[0].hex()}")
                    return 1
                n += 1
    # A known value, so that a change to the reference itself shows too:
    # NONE_HASH for PYTHONHASHSEED=0 is sha256(b"\x610") (CBOR text "0").
    assert ours("0", 1, [])[0] == hashlib.sha256(b"\x610").digest()
    print(f"{n} vectors agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
