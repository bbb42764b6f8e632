#!/usr/bin/env python3
"""Cross-check of the numpy model against llama.cpp (a developer tool, not
part of the test suite: llama-cpp-python builds llama.cpp from source, about
10 minutes on 2 cores).

    python3 -m pip install --no-deps --target .cache/llamacpp llama-cpp-python \\
        typing_extensions diskcache jinja2 markupsafe
    python3 -m pip install --no-deps --target .cache/pylib gguf
    python3 examples/engine/check_llamacpp.py [--keep /tmp/smollm2-f32.gguf]

llama.cpp multiplies Q4_1 weights with activations quantized to Q8_1, so on
the Q4_1 file its logits differ from exact float32 arithmetic (mean |diff|
about 0.2, top-1 agreement about 97%). To compare the arithmetic, the tool
writes the same weights dequantized into an F32 GGUF (with PyPI's gguf
writer), and runs both on it: tokenization, the logits of every prompt
position and 30 greedy tokens must agree.

llama.cpp's extra CPU buffer types (weight repacking, AMX) crash in some VMs
(general protection fault); the tool turns them off (use_extra_bufts)."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
for extra in ("llamacpp", "pylib"):
    if os.path.isdir(os.path.join(ROOT, ".cache", extra)):
        sys.path.append(os.path.join(ROOT, ".cache", extra))

import numpy as np  # noqa: E402

from engine.kv import ContiguousKV  # noqa: E402
from engine.model import Model, model_path  # noqa: E402


def write_f32_gguf(src: str, dst: str) -> None:
    import gguf
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k in ("general.architecture", "general.file_type"):
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, f.contents(), f.types[0], sub_type=f.types[1])
        else:
            w.add_key_value(k, f.contents(), f.types[0])
    w.add_file_type(0)
    for t in r.tensors:
        w.add_tensor(t.name, gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama(path: str):
    import llama_cpp
    import llama_cpp.llama as L
    orig = llama_cpp.llama_model_default_params

    def params():
        p = orig()
        p.use_extra_bufts = False
        return p
    L.llama_cpp.llama_model_default_params = params
    return llama_cpp.Llama(path, n_ctx=2048, logits_all=True, verbose=False, n_threads=2, n_batch=512)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", help="write (or reuse) the F32 GGUF here instead of a temporary file")
    ap.add_argument("--quantized", action="store_true", help="also compare on the Q4_1 file itself")
    a = ap.parse_args(argv)
    src = model_path()
    tmp = None
    f32 = a.keep
    if not f32:
        tmp = tempfile.TemporaryDirectory()
        f32 = os.path.join(tmp.name, "f32.gguf")
    if not os.path.exists(f32):
        print(f"writing {f32} (F32 weights of {src})")
        write_f32_gguf(src, f32)
    ok = True
    for path in [f32] + ([src] if a.quantized else []):
        print(f"== {path}")
        m = Model.load(path, allow_random=False)
        ll = llama(path)
        tok = m.tok
        texts = ["The capital of France is", "héllo wörld 日本語 🤗 ½ ² Ⅻ  \n\n x", "I'm 12345 years old.",
                 open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()]
        bad = sum(tok.encode(s) != ll.tokenize(s.encode(), add_bos=False, special=True) for s in texts)
        print(f"tokenizer: {len(texts) - bad}/{len(texts)} texts tokenized identically")
        ok &= bad == 0
        prompts = ["The capital of France is",
                   tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]),
                   tok.apply_chat_template([{"role": "user", "content": "Write a haiku about the sea."}]),
                   open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()[:1500]]
        for prompt in prompts:
            ids = tok.encode(prompt)
            (ours,) = m.forward([(0, ids, 0)], ContiguousKV(m.kv_layout()), all_logits=True)
            ll.reset()
            ll.eval(ids)
            theirs = np.array(ll.scores[:len(ids)], dtype=np.float32)
            agree = float((ours.argmax(1) == theirs.argmax(1)).mean())
            d = np.abs(ours - theirs)
            line = f"{len(ids):4} tokens: top-1 agreement {agree:.3f}, |diff| max {d.max():.4f} mean {d.mean():.5f}"
            if len(ids) < 100:
                a_, b_ = greedy_ours(m, ids, 30), greedy_llama(ll, ids, 30)
                line += f"; 30 greedy tokens {'identical' if a_ == b_ else 'DIFFER'}: {tok.decode(a_)[:50]!r}"
                if path == f32:
                    ok &= a_ == b_
            if path == f32:
                ok &= agree == 1.0 and d.max() < 0.2
            print(line)
    print("OK: the numpy model computes what llama.cpp computes" if ok else "MISMATCH")
    return 0 if ok else 1


def greedy_ours(m, ids, n):
    kv = ContiguousKV(m.kv_layout())
    (lg,) = m.forward([(0, ids, 0)], kv)
    out, p = [], len(ids)
    for _ in range(n):
        t = int(np.argmax(lg))
        if m.tok.is_eog(t):
            break
        out.append(t)
        (lg,) = m.forward([(0, [t], p)], kv)
        p += 1
    return out


def greedy_llama(ll, ids, n):
    ll.reset()
    ll.eval(ids)
    out = []
    for _ in range(n):
        t = int(np.argmax(ll.scores[ll.n_tokens - 1]))
        if t in (0, 2):
            break
        out.append(t)
        ll.eval([t])
    return out


if __name__ == "__main__":
    raise SystemExit(main())
