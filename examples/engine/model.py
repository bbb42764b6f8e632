"""SmolLM2-135M-Instruct (a Llama-architecture decoder) in float32 numpy,
loaded from its GGUF file, with its KV cache behind a KVStore (kv.py).

Per layer:  h = RMSNorm(x);  q, k, v = h Wq, h Wk, h Wv;  RoPE on q, k;
            k, v -> KV store;  x += GQA-attention(q, K, V) Wo;
            h = RMSNorm(x);  x += (silu(h Wgate) * h Wup) Wdown
then RMSNorm and the output projection (tied to the token embedding when the
file has no output.weight).

RoPE layout. llama.cpp's converter permutes the rows of attn_q / attn_k of
Llama models so that its RoPE (mode 0) rotates adjacent pairs (x[2i],
x[2i+1]) of each head. At load we undo that permutation and rotate the halves
(x[i], x[i + d/2]) instead, as the original (Hugging Face) model does: the
same attention scores, and keys in the KV cache in HF's layout, as vLLM's
would be. theta_i = pos * freq_base^(-2i/d), freq_base from llama.rope.freq_base.

Weights are dequantized to float32 once at load (about 0.5 GB for
SmolLM2-135M); the projections of one layer are fused (Q|K|V, gate|up) so a
step is a few large matmuls over all tokens of all sequences of the batch.
"""
from __future__ import annotations

import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Hashable, Sequence

import numpy as np

from . import gguf as gguf_mod
from .kv import ContiguousKV, KVLayout, KVStore
from .tokenizer import TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNUSED, Tokenizer, bytes_to_unicode

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def model_path() -> str:
    """Where the GGUF file is looked for: $KVCACHE_MODEL (a file), else
    $KVCACHE_MODEL_DIR/<file>, else <repo>/.cache/model/<file> (where
    scripts/fetch-model puts it)."""
    p = os.environ.get("KVCACHE_MODEL")
    if p:
        return p
    d = os.environ.get("KVCACHE_MODEL_DIR") or os.path.join(REPO_ROOT, ".cache", "model")
    return os.path.join(d, MODEL_FILE)


def blas_library() -> str:
    """The BLAS shared library numpy's matmul runs on in this process (Linux:
    from /proc/self/maps), or "" when unknown. Debian's numpy links libblas.so.3,
    which the alternatives system points at the reference BLAS (libblas3,
    about 2 GFLOP/s) or at OpenBLAS (libopenblas0-pthread, 20x faster here)."""
    np.ones((2, 2), np.float32) @ np.ones((2, 2), np.float32)
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "blas" in line.lower() or "mkl" in line.lower()}
    except OSError:
        return ""
    libs = sorted(os.path.realpath(p) for p in libs if p.startswith("/"))
    return ", ".join(dict.fromkeys(libs))


def warn_slow_blas() -> None:
    lib = blas_library()
    # Debian's reference BLAS lives in .../blas/libblas.so.3*; when it is loaded
    # (even beside OpenBLAS pulled in by liblapack) numpy's sgemm is its own.
    if lib and ("/blas/libblas.so" in lib or not any(
            k in lib.lower() for k in ("openblas", "mkl", "blis", "accelerate"))):
        print(f"WARNING: numpy runs on the reference BLAS ({lib}): the model is about 20x slower; "
              f"on Debian: apt-get install libopenblas0-pthread", file=sys.stderr)


@dataclass
class Config:
    n_vocab: int = 49152
    n_embd: int = 576
    n_layers: int = 30
    n_heads: int = 9
    n_kv_heads: int = 3
    n_ff: int = 1536
    rope_base: float = 100000.0
    rms_eps: float = 1e-5
    n_ctx: int = 8192
    head_dim: int = field(init=False)

    def __post_init__(self):
        self.head_dim = self.n_embd // self.n_heads

    @classmethod
    def from_gguf(cls, r: gguf_mod.GGUFReader) -> "Config":
        arch = r.get("general.architecture")
        if arch != "llama":
            raise ValueError(f"architecture {arch!r}: only llama is implemented")
        g = lambda k, d=None: r.get(f"llama.{k}", d)
        n_embd, n_heads = int(g("embedding_length")), int(g("attention.head_count"))
        rot = g("rope.dimension_count")
        if rot is not None and int(rot) != n_embd // n_heads:
            raise ValueError("partial RoPE (rope.dimension_count < head_dim) is not implemented")
        if g("rope.scaling.type") not in (None, "none"):
            raise ValueError("RoPE scaling is not implemented")
        n_vocab = g("vocab_size") or len(r.get("tokenizer.ggml.tokens"))
        return cls(n_vocab=int(n_vocab), n_embd=n_embd, n_layers=int(g("block_count")),
                   n_heads=n_heads, n_kv_heads=int(g("attention.head_count_kv", n_heads)),
                   n_ff=int(g("feed_forward_length")), rope_base=float(g("rope.freq_base", 10000.0)),
                   rms_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
                   n_ctx=int(g("context_length", 8192)))


def unpermute_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's permutation of Q/K rows (convert_hf_to_gguf.py
    LlamaModel.permute): GGUF row 2i+s of a head is HF row s*d/2 + i."""
    out_dim, n_in = w.shape
    d = out_dim // n_heads
    return w.reshape(n_heads, d // 2, 2, n_in).swapaxes(1, 2).reshape(out_dim, n_in)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    ms = np.einsum("ij,ij->i", x, x) / x.shape[1]
    return x * (1.0 / np.sqrt(ms + eps)).astype(np.float32)[:, None] * w



def plan_batch(c: "Config", kv, batch) -> tuple[list, list, list]:
    """A forward's batch [(seq, tokens, start)] checked (each sequence once,
    some tokens, within the context) and every sequence's KV rows reserved
    before any compute (kv.reserve: OutOfBlocks leaves nothing half done).
    Returns segs [(seq, start, first row, end row) in the batch], and the
    batch's token ids and positions as flat lists. Both engines (numpy here,
    torch_model.py) plan a step with it."""
    if len({seq for seq, _, _ in batch}) != len(batch):
        raise ValueError("a sequence appears twice in one batch")
    segs, toks, pos = [], [], []
    n = 0
    for seq, tokens, start in batch:
        T = len(tokens)
        if T == 0:
            raise ValueError(f"sequence {seq!r}: no tokens")
        if start + T > c.n_ctx:
            raise ValueError(f"sequence {seq!r}: {start + T} tokens > context {c.n_ctx}")
        kv.reserve(seq, start, start + T)
        segs.append((seq, start, n, n + T))
        toks.extend(int(t) for t in tokens)
        pos.extend(range(start, start + T))
        n += T
    return segs, toks, pos


class Model:
    """The decoder. `forward` runs one step for a batch of sequences; `generate`
    (below) drives it."""

    def __init__(self, cfg: Config, weights: dict, tokenizer: Tokenizer, *, random: bool = False,
                 source: str = ""):
        self.cfg = cfg
        self.tok = tokenizer
        self.random = random
        self.source = source
        # what the engine names its kvcached pool after
        self.name = "smollm2-135m-instruct"
        c = cfg
        self.tok_embd = weights["token_embd"]            # (n_vocab, n_embd)
        self.out_w = weights.get("output", self.tok_embd)  # (n_vocab, n_embd)
        self.out_norm = weights["output_norm"]
        self.layers = weights["layers"]
        half = c.head_dim // 2
        self.inv_freq = (c.rope_base ** (-np.arange(half, dtype=np.float64) * 2 / c.head_dim))
        self._tri_cache: dict[int, np.ndarray] = {}
        self.attn_chunk = 64   # queries per attention chunk in prefill
        self._rope_n = 0
        self._cos = self._sin = None
        self.load_seconds = 0.0

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | None = None, *, allow_random: bool = True, seed: int = 0,
             quiet: bool = False) -> "Model":
        """The model from its GGUF file (model_path() by default). With no
        file and allow_random, seeded random weights of SmolLM2-135M's shapes
        and a byte-level tokenizer, with a warning."""
        path = path or model_path()
        if not quiet:
            warn_slow_blas()
        t0 = time.perf_counter()
        if not os.path.exists(path):
            if not allow_random:
                raise FileNotFoundError(f"{path}: no model file (run scripts/fetch-model)")
            msg = (f"model file {path} not found (run scripts/fetch-model): "
                   f"running SmolLM2-135M's shapes with seeded RANDOM weights (seed {seed}); "
                   f"the text is meaningless")
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
            if not quiet:
                print(f"WARNING: {msg}", file=sys.stderr)
            m = cls.random_model(Config(), seed=seed)
            m.load_seconds = time.perf_counter() - t0
            return m
        r = gguf_mod.GGUFReader(path)
        cfg = Config.from_gguf(r)
        tok = Tokenizer.from_gguf(r)
        T = r.tensors

        def f32(name):
            return T[name].dequantize()

        c = cfg
        layers = []
        for i in range(c.n_layers):
            p = f"blk.{i}."
            # 1/sqrt(head_dim) of the attention scores folded into wq
            wq = unpermute_rope(f32(p + "attn_q.weight"), c.n_heads) * np.float32(1.0 / np.sqrt(c.head_dim))
            wk = unpermute_rope(f32(p + "attn_k.weight"), c.n_kv_heads)
            wv = f32(p + "attn_v.weight")
            layers.append({
                "attn_norm": f32(p + "attn_norm.weight"),
                # (n_embd, q + k + v) so that h @ wqkv is one matmul
                "wqkv": np.ascontiguousarray(np.concatenate([wq, wk, wv]).T),
                "wo": np.ascontiguousarray(f32(p + "attn_output.weight").T),
                "ffn_norm": f32(p + "ffn_norm.weight"),
                "wgu": np.ascontiguousarray(np.concatenate(
                    [f32(p + "ffn_gate.weight"), f32(p + "ffn_up.weight")]).T),
                "wdown": np.ascontiguousarray(f32(p + "ffn_down.weight").T),
            })
        weights = {"token_embd": f32("token_embd.weight"), "output_norm": f32("output_norm.weight"),
                   "layers": layers}
        if "output.weight" in T:
            weights["output"] = f32("output.weight")
        m = cls(cfg, weights, tok, source=path)
        r.close()
        m.load_seconds = time.perf_counter() - t0
        return m

    @classmethod
    def random_model(cls, cfg: Config, seed: int = 0) -> "Model":
        rng = np.random.default_rng(seed)
        c = cfg

        def w(*shape, scale=0.02):
            return (rng.standard_normal(shape, dtype=np.float32) * scale)

        qkv = (c.n_heads + 2 * c.n_kv_heads) * c.head_dim
        layers = [{"attn_norm": np.ones(c.n_embd, np.float32), "wqkv": w(c.n_embd, qkv),
                   "wo": w(c.n_embd, c.n_embd), "ffn_norm": np.ones(c.n_embd, np.float32),
                   "wgu": w(c.n_embd, 2 * c.n_ff), "wdown": w(c.n_ff, c.n_embd)}
                  for _ in range(c.n_layers)]
        weights = {"token_embd": w(c.n_vocab, c.n_embd), "output_norm": np.ones(c.n_embd, np.float32),
                   "layers": layers}
        m = cls(c, weights, byte_tokenizer(c.n_vocab), random=True, source=f"random(seed={seed})")
        m.name = f"smollm2-135m-random-s{seed}"
        return m

    def kv_layout(self, block_size: int = 16, dtype: str = "float16") -> KVLayout:
        c = self.cfg
        return KVLayout(c.n_layers, c.n_kv_heads, c.head_dim, block_size, dtype)

    # ------------------------------------------------------------------ forward
    def _rope_tables(self, n: int):
        if n > self._rope_n:
            n2 = max(n, 2 * self._rope_n, 1024)
            ang = np.arange(n2, dtype=np.float64)[:, None] * self.inv_freq[None, :]
            self._cos = np.cos(ang).astype(np.float32)
            self._sin = np.sin(ang).astype(np.float32)
            self._rope_n = n2
        return self._cos, self._sin

    @staticmethod
    def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """x (N, H, d), cos/sin (N, d/2): rotate (x[i], x[i + d/2])."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        c, s = cos[:, None, :], sin[:, None, :]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)

    def _attention(self, q: np.ndarray, K: np.ndarray, V: np.ndarray, start: int) -> np.ndarray:
        """q (T, n_heads, d) of positions [start, start+T) (scaled by
        1/sqrt(d)); K, V float32 (n_kv, n, d) of positions [0, n), n = start +
        T. Causal. Returns (T, n_heads*d). Long prompts go by chunks of
        queries, each against the keys it may see: the score matrices stay
        small and the masked half is never computed."""
        T = q.shape[0]
        C = self.attn_chunk
        if T <= C:
            return self._attention_chunk(q, K, V, start)
        out = np.empty((T, q.shape[1] * q.shape[2]), np.float32)
        for a in range(0, T, C):
            b = min(T, a + C)
            out[a:b] = self._attention_chunk(q[a:b], K[:, :start + b], V[:, :start + b], start + a)
        return out

    def _attention_chunk(self, q: np.ndarray, K: np.ndarray, V: np.ndarray, start: int) -> np.ndarray:
        c = self.cfg
        T, n = q.shape[0], K.shape[1]
        g = c.n_heads // c.n_kv_heads
        d = c.head_dim
        # query head h uses KV head h // g: (n_kv, g*T, d)
        qh = q.reshape(T, c.n_kv_heads, g, d).transpose(1, 2, 0, 3).reshape(c.n_kv_heads, g * T, d)
        s = np.matmul(qh, K.transpose(0, 2, 1))               # (n_kv, g*T, n)
        if T > 1:
            # query t (position start + t) sees keys j <= start + t: mask the
            # upper triangle of the last T columns
            s.reshape(c.n_kv_heads, g, T, n)[..., start:] += self._tri(T)
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        l = s.sum(axis=-1, keepdims=True)
        o = np.matmul(s, V)                                    # (n_kv, g*T, d)
        o /= l
        return o.reshape(c.n_kv_heads, g, T, d).transpose(2, 0, 1, 3).reshape(T, c.n_heads * d)

    def _tri(self, T: int) -> np.ndarray:
        """(T, T) float32: 0 on and below the diagonal, -inf above."""
        m = self._tri_cache.get(T)
        if m is None:
            m = np.triu(np.full((T, T), -np.inf, np.float32), 1)
            if len(self._tri_cache) < 64:
                self._tri_cache[T] = m
        return m

    def forward(self, batch: Sequence[tuple[Hashable, Sequence[int], int]], kv: KVStore,
                *, all_logits: bool = False) -> list[np.ndarray]:
        """One step for several sequences at once (continuous batching: any
        mix of prompts and single decode tokens).

        batch: (seq, tokens, start) per sequence: the new tokens sit at
        positions [start, start + len(tokens)); kv must hold positions
        [0, start) of seq already; each sequence at most once. Every
        sequence's kv.reserve() runs before any compute, so OutOfBlocks
        leaves nothing half done (blocks reserved for earlier sequences of
        the batch stay with them). Returns per sequence the float32 logits
        of its last token (n_vocab,), or with all_logits of every new token
        (T, n_vocab)."""
        with np.errstate(over="ignore"):   # exp(-gate) of silu may overflow to inf: fine
            return self._forward(batch, kv, all_logits)

    def _forward(self, batch, kv, all_logits):
        c = self.cfg
        segs, toks, pos = plan_batch(c, kv, batch)
        n = len(toks)
        toks = np.asarray(toks, dtype=np.int64)
        pos = np.asarray(pos, dtype=np.int64)
        cos_t, sin_t = self._rope_tables(int(pos.max()) + 1)
        cos, sin = cos_t[pos], sin_t[pos]
        x = self.tok_embd[toks]                                # (N, n_embd) float32
        nq, nk = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        attn = np.empty((n, nq), np.float32)
        for li, L in enumerate(self.layers):
            h = rms_norm(x, L["attn_norm"], c.rms_eps)
            qkv = h @ L["wqkv"]
            # RoPE on q and k at once; q comes out scaled by 1/sqrt(d) (folded into wq)
            qk = self._rope(qkv[:, :nq + nk].reshape(n, c.n_heads + c.n_kv_heads, c.head_dim), cos, sin)
            q = qk[:, :c.n_heads]
            k = qk[:, c.n_heads:].transpose(1, 0, 2)            # (n_kv, N, d)
            v = qkv[:, nq + nk:].reshape(n, c.n_kv_heads, c.head_dim).transpose(1, 0, 2)
            for seq, start, a, b in segs:
                kv.write(seq, li, start, k[:, a:b], v[:, a:b])
                K, V = kv.read(seq, li, start + b - a)
                attn[a:b] = self._attention(q[a:b], K, V, start)
            x += attn @ L["wo"]
            h = rms_norm(x, L["ffn_norm"], c.rms_eps)
            gu = h @ L["wgu"]
            gate, up = gu[:, :c.n_ff], gu[:, c.n_ff:]
            act = np.negative(gate)                             # silu(gate) * up, in place
            np.exp(act, out=act)
            act += 1.0
            np.divide(gate, act, out=act)
            act *= up
            x += act @ L["wdown"]
        rows = np.arange(n) if all_logits else np.array([b - 1 for _, _, _, b in segs])
        hN = rms_norm(x[rows], self.out_norm, c.rms_eps)
        logits = hN @ self.out_w.T
        if all_logits:
            return [logits[a:b] for _, _, a, b in segs]
        return [logits[i] for i in range(len(segs))]


# ---------------------------------------------------------------------- tokenizer stand-in

def byte_tokenizer(n_vocab: int) -> Tokenizer:
    """The tokenizer of the random-weights model: SmolLM2's 17 control tokens
    (same ids), the 256 byte tokens, and fillers that decode to one byte each
    (no merges: one token per byte)."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>",
                "<file_sep>", "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>",
                "<issue_closed>", "<jupyter_start>", "<jupyter_text>", "<jupyter_code>",
                "<jupyter_output>", "<jupyter_script>", "<empty_output>"]
    enc = bytes_to_unicode()
    tokens = specials + [enc[b] for b in range(256)]
    types = [TOKEN_CONTROL] * len(specials) + [TOKEN_NORMAL] * 256
    i = 0
    while len(tokens) < n_vocab:
        tokens.append(enc[32 + i % 95])  # filler: a printable ASCII byte
        types.append(TOKEN_UNUSED)
        i += 1
    return Tokenizer(tokens, [], types, bos_id=1, eos_id=2, pre="smollm")


# ---------------------------------------------------------------------- sampling and generate

def sample(logits: np.ndarray, *, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
           rng: np.random.Generator | None = None) -> int:
    """Greedy when temperature <= 0; else softmax(logits / temperature) cut to
    the top_k most likely and to the smallest set whose mass reaches top_p."""
    if temperature <= 0:
        return int(np.argmax(logits))
    rng = rng if rng is not None else np.random.default_rng()
    z = logits.astype(np.float64) / temperature
    order = np.argsort(-z, kind="stable")
    if top_k > 0:
        order = order[:top_k]
    p = np.exp(z[order] - z[order[0]])
    p /= p.sum()
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), top_p)) + 1
        order, p = order[:keep], p[:keep] / p[:keep].sum()
    return int(order[rng.choice(len(order), p=p)])


@dataclass
class Generation:
    text: str
    tokens: list[int]            # generated ids (eog excluded)
    prompt_tokens: list[int]
    finish: str                  # "eog" or "length"
    prefill_s: float = 0.0
    decode_s: float = 0.0
    logits: list = field(default_factory=list)   # per generated token when keep_logits


def generate(model: Model, prompt: str | Sequence[int], max_tokens: int = 64, *,
             temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = 0,
             kv: KVStore | None = None, chat: bool = False, seq: Hashable = 0,
             keep_logits: bool = False, stop_at_eog: bool = True) -> Generation:
    """Prefill the prompt in one step, then decode token by token.
    prompt: text (chat=True wraps it as a user message in ChatML) or ids."""
    tok = model.tok
    if isinstance(prompt, str):
        ids = tok.encode_chat([{"role": "user", "content": prompt}]) if chat else tok.encode(prompt)
    else:
        ids = list(prompt)
    if not ids:
        raise ValueError("empty prompt")
    kv = kv if kv is not None else ContiguousKV(model.kv_layout())
    rng = np.random.default_rng(seed)
    out, kept = [], []
    finish = "length"
    try:
        t0 = time.perf_counter()
        (logits,) = model.forward([(seq, ids, 0)], kv)
        t1 = time.perf_counter()
        n = len(ids)
        for i in range(max_tokens):
            if keep_logits:
                kept.append(logits)
            t = sample(logits, temperature=temperature, top_p=top_p, top_k=top_k, rng=rng)
            if stop_at_eog and tok.is_eog(t):
                finish = "eog"
                break
            out.append(t)
            if i + 1 == max_tokens:
                break
            (logits,) = model.forward([(seq, [t], n)], kv)
            n += 1
        t2 = time.perf_counter()
    finally:
        kv.free(seq)
    return Generation(tok.decode(out, special=False), out, ids, finish, t1 - t0, t2 - t1, kept)
