#!/usr/bin/env python3
"""Generates text with SmolLM2-135M-Instruct (pure numpy, no kvcached).

    python3 examples/engine/generate.py "The capital of France is"
    python3 examples/engine/generate.py --chat "What is the capital of France?"
    python3 examples/engine/generate.py -n 64 -t 0.8 --top-p 0.9 --seed 1 "Once upon a time"
    python3 examples/engine/generate.py --paged "..."      (paged KV over in-process blocks)

The model file comes from scripts/fetch-model (or $KVCACHE_MODEL); without it
the model runs with seeded random weights and says so."""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.kv import ContiguousKV, LocalBlockAllocator, PagedKV  # noqa: E402
from engine.model import Model, generate  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompt")
    ap.add_argument("-n", "--max-tokens", type=int, default=48)
    ap.add_argument("-t", "--temperature", type=float, default=0.0, help="0 = greedy (default)")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chat", action="store_true", help="wrap the prompt in the ChatML template")
    ap.add_argument("--paged", action="store_true", help="paged KV store (in-process blocks)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--kv-dtype", default="float16", choices=["float16", "float32"])
    ap.add_argument("--model", help="GGUF file (default: $KVCACHE_MODEL or .cache/model/)")
    ap.add_argument("-v", "--verbose", action="store_true", help="timings and token counts on stderr")
    a = ap.parse_args(argv)

    m = Model.load(a.model)
    layout = m.kv_layout(a.block_size, a.kv_dtype)
    if a.paged:
        n_blocks = -(-(len(a.prompt.encode()) + 64 + a.max_tokens) // a.block_size) + 4
        kv = PagedKV(LocalBlockAllocator(layout, n_blocks))
    else:
        kv = ContiguousKV(layout)
    g = generate(m, a.prompt, a.max_tokens, temperature=a.temperature, top_p=a.top_p,
                 top_k=a.top_k, seed=a.seed, chat=a.chat, kv=kv)
    print(g.text if a.chat else a.prompt + g.text)
    if a.verbose:
        nd = len(g.tokens)
        print(f"[{m.source}: load {m.load_seconds:.2f} s; prompt {len(g.prompt_tokens)} tokens "
              f"in {g.prefill_s:.2f} s ({len(g.prompt_tokens) / g.prefill_s:.0f} tok/s); "
              f"{nd} generated in {g.decode_s:.2f} s"
              f"{f' ({nd / g.decode_s:.1f} tok/s)' if g.decode_s > 0 else ''}; finish: {g.finish}]",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
