#!/usr/bin/env python3
"""Speed of the numpy model on this machine: load time, prefill tokens/s of
one prompt, decode tokens/s of one sequence and of a batch.

    python3 examples/engine/bench_model.py [--prompt-tokens 500] [--decode 32]
                                           [--batch 8] [--paged]

The prompt is English text (docs/architecture.md of this repository, cut to
--prompt-tokens tokens)."""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from engine.kv import ContiguousKV, LocalBlockAllocator, PagedKV  # noqa: E402
from engine.model import REPO_ROOT, Model, blas_library  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-tokens", type=int, default=500)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--paged", action="store_true")
    ap.add_argument("--repeat", type=int, default=2, help="prefill runs (best is reported)")
    ap.add_argument("--kv-dtype", default="float16", choices=["float16", "float32"])
    ap.add_argument("--block-size", type=int, default=16)
    a = ap.parse_args(argv)

    m = Model.load()
    print(f"model: {m.source}\nload: {m.load_seconds:.2f} s")
    print(f"BLAS: {blas_library() or 'unknown'} (OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}, "
          f"{os.cpu_count()} CPUs)")
    print(f"KV: {'paged' if a.paged else 'contiguous'}, {a.kv_dtype}, {a.block_size} tokens/block "
          f"({m.kv_layout(a.block_size, a.kv_dtype).block_bytes} bytes)")
    text = open(os.path.join(REPO_ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    ids = m.tok.encode(text)
    while len(ids) < a.prompt_tokens:
        ids = ids + ids
    ids = ids[:a.prompt_tokens]
    layout = m.kv_layout(a.block_size, a.kv_dtype)
    need = -(-(a.prompt_tokens + a.decode + 1) // layout.block_size)

    def store(nseq=1):
        if a.paged:
            return PagedKV(LocalBlockAllocator(layout, need * nseq + 8))
        return ContiguousKV(layout)

    best = None
    for _ in range(a.repeat):
        kv = store()
        t0 = time.perf_counter()
        (logits,) = m.forward([(0, ids, 0)], kv)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    print(f"prefill {len(ids)} tokens: {best:.2f} s = {len(ids) / best:.0f} tokens/s")

    n = len(ids)
    t = int(np.argmax(logits))
    t0 = time.perf_counter()
    for _ in range(a.decode):
        (logits,) = m.forward([(0, [t], n)], kv)
        t = int(np.argmax(logits))
        n += 1
    dt = time.perf_counter() - t0
    print(f"decode 1 sequence at {len(ids)}..{n} tokens: {a.decode / dt:.1f} tokens/s "
          f"({1000 * dt / a.decode:.0f} ms/token)")

    if a.batch > 1:
        B = a.batch
        kv = store(B)
        # B sequences of the same prompt (prefilled one by one, not timed)
        for s in range(B):
            (logits,) = m.forward([(s, ids, 0)], kv)
        toks = [int(np.argmax(logits))] * B
        n = len(ids)
        t0 = time.perf_counter()
        for _ in range(a.decode):
            outs = m.forward([(s, [toks[s]], n) for s in range(B)], kv)
            toks = [int(np.argmax(o)) for o in outs]
            n += 1
        dt = time.perf_counter() - t0
        print(f"decode batch of {B} at {len(ids)}..{n} tokens: {B * a.decode / dt:.1f} tokens/s "
              f"({1000 * dt / a.decode:.0f} ms/step)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
