#!/usr/bin/env python3
"""Compress on demote with the real model: does a prefix that came back
through an FP8 tier change what SmolLM2-135M-Instruct says?

    PYTHONPATH=build/python $(scripts/vllm-env --path) \\
        examples/engine/check_compress.py [--prompts 24] [--gen 16]

One daemon (host backend, a host tier) with four namespaces: g1 (the
baseline: prefixes never leave G1), raw (demoted to G2 uncompressed and
promoted back: must be bit-identical to g1), e4m3 and e5m2 (compress =
fp8_e4m3 / fp8_e5m2); with --fp32 a fifth, f32: a float32 KV cache kept
in G1, for scale (what the engine's own choice of KV precision changes).
For each namespace the reference engine (numpy, the
real weights from scripts/fetch-model) prefills every prompt, which seals
the prompt's full blocks; then, except for g1, kvctl evict --tier g1 moves
every cached block down to G2 (quantized in e4m3/e5m2); then the engine
generates --gen greedy tokens for each prompt, its prefix looked up
(promoted back, dequantized) and the rest computed. Per namespace against
g1 it prints:

  free-running: prompts whose greedy tokens are all the baseline's, and the
                mean share of tokens before the first difference;
  teacher-forced: at each of the --gen positions, fed the baseline's tokens
                up to there (each a lookup of the same prefix): top-1
                agreement with the baseline's token, and the mean and max KL
                divergence KL(baseline || this) of the next-token
                distributions (nats).

Exit status 0, or 1 when raw differs from g1 at all (a lossless tier must
be lossless) or a prefix did not come back from the tier."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))

from engine.bench_engine import Daemon as BenchDaemon  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.model import Model  # noqa: E402

SYSTEM = ("You are a careful assistant. Answer in two or three sentences, plainly, "
          "without lists.")

# Short questions (prefixes of 2 to 4 blocks of 16 tokens); chunks() gives the long ones.
QUESTIONS = [
    "What is the capital of France, and why did it become the capital?",
    "Explain how a refrigerator keeps food cold.",
    "Why is the sky blue during the day and red at sunset?",
    "Write a short story about a cat who learns to play the piano in an old house by the sea.",
    "What are the main differences between a virus and a bacterium?",
    "How does a hash table work, and what happens when two keys collide?",
    "Summarize the causes of the First World War in a few sentences.",
    "Give me advice for a first marathon: training, food and the night before the race.",
    "What is photosynthesis? Explain it to a ten year old child.",
    "Describe the water cycle, from the ocean to the clouds and back to the rivers.",
    "Why do we have seasons on Earth? Many people think it is the distance to the sun.",
    "How do vaccines train the immune system to recognize a disease?",
    "Translate into French: the library opens at nine in the morning and closes at six.",
    "What is the difference between weather and climate?",
    "Explain recursion in programming with a simple example in Python.",
    "Tell me about the history of the bicycle, from the first wooden models to today.",
    "What should I consider when choosing a laptop for programming and light gaming?",
    "How do airplanes stay in the air? Explain lift without equations.",
    "What is a black hole, and can anything escape from it?",
    "Write a polite email asking my landlord to repair the heating in my apartment, which "
    "has not worked for a week although I reported it twice.",
    "Why do cats purr, and do they only purr when they are happy?",
    "What are prime numbers and why are they important in cryptography?",
    "Describe a healthy breakfast and explain why each part of it is useful.",
    "How does a car engine turn fuel into motion?",
    "What was the Renaissance, and which artists are most associated with it?",
    "Explain what inflation is and how central banks try to control it.",
    "How do bees make honey, and why is it important for them?",
    "What is machine learning? Give an everyday example of it.",
    "Why is sleep important for memory and learning?",
    "Describe the rules of chess for a complete beginner in a few sentences.",
    "What causes earthquakes, and why are some regions affected more than others?",
    "Write a haiku about autumn leaves falling into a quiet river.",
]


def chunks(n: int) -> list:
    """n pieces of docs/architecture.md, 600 to 1800 characters (about 150
    to 450 tokens): long prefixes of real text."""
    with open(os.path.join(REPO_ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        text = f.read()
    out, pos = [], 0
    for i in range(n):
        size = 600 + (i * 397) % 1200
        out.append(text[pos:pos + size])
        pos += size
    return out


class Daemon(BenchDaemon):
    """bench_engine's daemon with the namespaces of conf and a host tier."""

    def __init__(self, a, d, conf):
        super().__init__(a, d, "--config=" + conf, "--pool-size", "512MiB",
                         "--host-tier-size", "1GiB", page="2MiB")

    def tiers(self) -> dict:
        return {t["tier"]: t for t in self.status()["tiers"]}

    def settle(self):
        """Waits until no tier copy is in flight (an evict starts copies and
        returns: a lookup of a block still being copied would cancel its
        demotion and find it in G1)."""
        deadline = time.monotonic() + 120
        while any(t.get("inflight", 0) for t in self.tiers().values()):
            if time.monotonic() > deadline:
                raise SystemExit("the tiers do not settle")
            time.sleep(0.05)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float(np.sum(np.exp(lp) * (lp - lq)))


def run_namespace(model, d, ns, prompts, gen, base) -> dict:
    """Prefill, demote (but g1 and f32), then generate and teacher-force.
    base: the g1 run's result (None for g1 itself)."""
    dtype = "float32" if ns == "f32" else "float16"
    with Engine(model, d.sock, namespace=ns, max_batch=1, dtype=dtype) as eng:
        for ids in prompts:
            eng.generate([ids], 1, stop_at_eog=False)
        t2 = None
        if ns not in ("g1", "f32"):
            r = d.kvctl("evict", "--tier", "g1")
            if r.returncode:
                raise SystemExit("kvctl evict: " + r.stderr)
            d.settle()
            t2 = d.tiers().get("G2", {})
        free, forced, hits = [], [], []
        print("%s: prefilled, %s" % (ns, "demoted" if t2 else "kept in G1"), file=sys.stderr,
              flush=True)
        for i, ids in enumerate(prompts):
            (o,) = eng.generate([ids], gen, keep_logits=True, stop_at_eog=False)
            hits.append(o.hit_tokens)
            free.append(list(o.tokens))
            ref = base["free"][i] if base else o.tokens
            logits = [o.logits[0]]
            for j in range(1, gen):
                (oj,) = eng.generate([list(ids) + list(ref[:j])], 1, keep_logits=True,
                                     stop_at_eog=False)
                logits.append(oj.logits[0])
            forced.append(logits)
    return {"free": free, "forced": forced, "hits": hits, "g2": t2}


def compare(res, base, gen) -> dict:
    same_all, prefix_share, top1, kls = 0, [], [], []
    for i, toks in enumerate(res["free"]):
        b = base["free"][i]
        k = 0
        while k < gen and toks[k] == b[k]:
            k += 1
        same_all += k == gen
        prefix_share.append(k / gen)
        for j in range(gen):
            top1.append(int(np.argmax(res["forced"][i][j])) == b[j])
            kls.append(kl(base["forced"][i][j], res["forced"][i][j]))
    return {"prompts_identical": same_all, "prompts": len(res["free"]),
            "first_diff_share": float(np.mean(prefix_share)), "top1": float(np.mean(top1)),
            "kl_mean": float(np.mean(kls)), "kl_max": float(np.max(kls)),
            "positions": len(kls)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvcached", default=os.path.join(REPO_ROOT, "build", "daemon", "kvcached"))
    ap.add_argument("--kvctl", default=os.path.join(REPO_ROOT, "build", "client", "kvctl"))
    ap.add_argument("--prompts", type=int, default=32,
                    help="half short questions, half long pieces of a document to summarize")
    ap.add_argument("--gen", type=int, default=16, help="tokens generated per prompt")
    ap.add_argument("--model", help="GGUF file (default: $KVCACHE_MODEL or .cache/model/)")
    ap.add_argument("--json", action="store_true", help="the figures as JSON too")
    ap.add_argument("--fp32", action="store_true",
                    help="also a float32 KV cache in G1 against the float16 baseline: the "
                         "size of the difference the engine's own KV precision makes")
    a = ap.parse_args(argv)

    model = Model.load(a.model)
    if model.source.startswith("random"):
        print("warning: no model file (scripts/fetch-model): random weights", file=sys.stderr)
    tok = model.tok
    prompts = [tok.encode_chat([{"role": "system", "content": SYSTEM},
                                {"role": "user", "content": q}])
               for q in QUESTIONS[:(a.prompts + 1) // 2]]
    prompts += [tok.encode_chat([{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": c + "\n\nSummarize the text above."}])
                for c in chunks(a.prompts // 2)]
    tmp = tempfile.mkdtemp(prefix="kvcached-compress.")
    conf = os.path.join(tmp, "kvcached.conf")
    uid = os.getuid()
    with open(conf, "w") as f:
        for ns, c in (("g1", "off"), ("raw", "off"), ("e4m3", "fp8_e4m3"), ("e5m2", "fp8_e5m2")):
            f.write("[namespace %s]\nusers = %d\ncompress = %s\n\n" % (ns, uid, c))
    d = Daemon(a, tmp, conf)
    rc = 0
    try:
        t0 = time.perf_counter()
        base = run_namespace(model, d, "g1", prompts, a.gen, None)
        out = {}
        for ns in ("raw", "e4m3", "e5m2") + (("f32",) if a.fp32 else ()):
            r = run_namespace(model, d, ns, prompts, a.gen, base)
            if min(r["hits"]) <= 0 and ns != "f32":
                print("FAIL: %s: a prefix did not come back from the tier" % ns, file=sys.stderr)
                rc = 1
            out[ns] = compare(r, base, a.gen)
            out[ns]["g2_compressed_bytes"] = (r["g2"] or {}).get("compressed_bytes", 0)
            out[ns]["g2_saved_bytes"] = (r["g2"] or {}).get("compression_saved_bytes", 0)
            out[ns]["hit_tokens"] = int(sum(r["hits"]))
        lens = [len(p) for p in prompts]
        print("SmolLM2-135M-Instruct (%s), %d prompts of %d-%d tokens (prefixes of %d blocks "
              "in all from the tier), %d greedy tokens each; %.0f s"
              % (model.source, len(prompts), min(lens), max(lens),
                 out["raw"]["hit_tokens"] // 16, a.gen, time.perf_counter() - t0))
        print("%-6s %11s %12s %10s %11s %10s %14s" % ("tier", "identical", "before diff",
                                                        "top-1", "KL mean", "KL max",
                                                        "G2 saved"))
        for ns, m in out.items():
            print("%-6s %5d of %-3d %11.1f%% %9.2f%% %11.2e %10.2e %13.1f%%"
                  % (ns, m["prompts_identical"], m["prompts"], 100 * m["first_diff_share"],
                     100 * m["top1"], m["kl_mean"], m["kl_max"],
                     100 * m["g2_saved_bytes"] / max(1, m["g2_saved_bytes"]
                                                     + m["g2_compressed_bytes"])
                     if m["g2_compressed_bytes"] else 0.0))
        if a.json:
            print(json.dumps(out, indent=1))
        if out["raw"]["kl_max"] != 0.0 or out["raw"]["prompts_identical"] != len(prompts):
            print("FAIL: the uncompressed tier changed the model's output", file=sys.stderr)
            rc = 1
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
