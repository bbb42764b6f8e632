"""GPT-2 byte-level BPE tokenizer built from a GGUF file's metadata, as
llama.cpp runs it for SmolLM2 (tokenizer.ggml.model = "gpt2",
tokenizer.ggml.pre = "smollm").

Encoding a text:
  1. Special (control) tokens such as <|im_start|> are cut out first when
     `special=True` (llama.cpp's parse_special); the rest is plain text.
  2. Pre-tokenization, llama.cpp's regexes for pre type "smollm" applied in
     turn, each splitting the pieces the one before left:
         \\p{N}                     every digit alone
         's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
     (the GPT-2 pattern). Python's `re` has no \\p{L}, so the pattern is
     matched by a hand-written scanner over Unicode categories.
  3. Each piece's UTF-8 bytes are mapped to printable characters
     (GPT-2's bytes_to_unicode) and merged by BPE: repeatedly the adjacent
     pair with the lowest merge rank (tokenizer.ggml.merges order).
Decoding maps token strings back through the inverse byte map.
"""
from __future__ import annotations

import unicodedata
from functools import lru_cache
from typing import Iterable, Sequence

# token types (llama.cpp's llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# Unicode White_Space (what llama.cpp's \s means; Python's str.isspace() also
# takes U+001C..U+001F).
_WHITESPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
                        "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_L, _N, _S, _O, _X = 0, 1, 2, 3, 4  # letter, number, whitespace, other, unassigned


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map: printable Latin-1
    bytes map to themselves, the other 68 to U+0100 onwards in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


@lru_cache(maxsize=None)
def _cls(ch: str) -> int:
    if ch in _WHITESPACE:
        return _S
    c = unicodedata.category(ch)
    return _L if c[0] == "L" else _N if c[0] == "N" else _X if c == "Cn" else _O


_CONTRACTIONS = ("s", "t", "m", "d", "re", "ve", "ll")


def _split_gpt2(text: str, out: list[str]) -> None:
    """Appends the matches of the GPT-2 pattern over `text` (which covers it),
    the way llama.cpp's unicode_regex_split_custom_gpt2 scans it."""
    n = len(text)
    cls = [_cls(c) for c in text]
    i = 0
    while i < n:
        c = text[i]
        # 's|'t|'re|'ve|'m|'ll|'d (case-sensitive)
        if c == "'" and i + 1 < n:
            if text[i + 1:i + 3] in ("re", "ve", "ll"):
                out.append(text[i:i + 3]); i += 3; continue
            if text[i + 1] in "stmd":
                out.append(text[i:i + 2]); i += 2; continue
        # ' ?\p{L}+' | ' ?\p{N}+' | ' ?[^\s\p{L}\p{N}]+'
        j = i + 1 if c == " " else i
        if j < n and cls[j] in (_L, _N, _O):
            k, e = cls[j], j + 1
            while e < n and cls[e] == k:
                e += 1
            out.append(text[i:e]); i = e; continue
        # '\s+(?!\S)' | '\s+'
        if cls[i] == _S:
            e = i + 1
            while e < n and cls[e] == _S:
                e += 1
            if e < n and e - i >= 2:
                e -= 1   # the last whitespace goes with what follows
            out.append(text[i:e]); i = e; continue
        # an unassigned code point (llama.cpp: no flags) is a piece alone
        out.append(c); i += 1


def pre_tokenize(text: str, pre: str = "smollm") -> list[str]:
    """Splits plain text (no special tokens) into pre-tokens."""
    if pre not in ("smollm", "gpt2", "starcoder", "refact", "command-r", "codeshell",
                   "exaone", "minerva", "default"):
        raise ValueError(f"pre-tokenizer {pre!r} not implemented")
    out: list[str] = []
    if pre == "gpt2" or pre == "default":
        _split_gpt2(text, out)
        return out
    # first \p{N}: each digit is a piece; the text between goes to the GPT-2 pattern
    start = 0
    for i, ch in enumerate(text):
        if _cls(ch) == _N:
            if i > start:
                _split_gpt2(text[start:i], out)
            out.append(ch)
            start = i + 1
    if start < len(text):
        _split_gpt2(text[start:], out)
    return out


class Tokenizer:
    def __init__(self, tokens: Sequence[str], merges: Sequence[str],
                 token_types: Sequence[int] | None = None, *, bos_id: int | None = None,
                 eos_id: int | None = None, pre: str = "smollm", add_bos: bool = False,
                 chat_template: str | None = None):
        self.tokens = list(tokens)
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        self.ranks = {}
        for r, m in enumerate(merges):
            a, sep, b = m.partition(" ")
            if not sep:
                raise ValueError(f"bad merge {m!r}")
            self.ranks[(a, b)] = r
        self.types = list(token_types) if token_types is not None else [TOKEN_NORMAL] * len(self.tokens)
        self.bos_id, self.eos_id, self.pre, self.add_bos = bos_id, eos_id, pre, add_bos
        self.chat_template = chat_template
        self.byte_enc = bytes_to_unicode()
        self.byte_dec = {c: b for b, c in self.byte_enc.items()}
        # tokens cut out of the text before BPE: control and user-defined ones
        self.special = {t: i for i, t in enumerate(self.tokens)
                        if self.types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED) and t}
        self._special_sorted = sorted(self.special, key=len, reverse=True)
        self._special_first = {}
        for t in self._special_sorted:
            self._special_first.setdefault(t[0], []).append(t)
        self._cache: dict[str, list[int]] = {}
        self.im_start = self.special.get("<|im_start|>")
        self.im_end = self.special.get("<|im_end|>")

    @classmethod
    def from_gguf(cls, reader) -> "Tokenizer":
        md = reader.metadata
        model = md.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"tokenizer model {model!r} not implemented (gpt2 only)")
        types = md.get("tokenizer.ggml.token_type")
        return cls(md["tokenizer.ggml.tokens"], md["tokenizer.ggml.merges"],
                   None if types is None else [int(t) for t in types],
                   bos_id=md.get("tokenizer.ggml.bos_token_id"),
                   eos_id=md.get("tokenizer.ggml.eos_token_id"),
                   pre=md.get("tokenizer.ggml.pre", "default"),
                   add_bos=bool(md.get("tokenizer.ggml.add_bos_token", False)),
                   chat_template=md.get("tokenizer.chat_template"))

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    # ------------------------------------------------------------ encoding
    def _bpe(self, piece: str) -> list[int]:
        ids = self._cache.get(piece)
        if ids is not None:
            return ids
        word = [self.byte_enc[b] for b in piece.encode("utf-8")]
        ranks = self.ranks
        while len(word) > 1:
            best, best_i = None, -1
            for i in range(len(word) - 1):
                r = ranks.get((word[i], word[i + 1]))
                if r is not None and (best is None or r < best):
                    best, best_i = r, i
            if best is None:
                break
            a, b = word[best_i], word[best_i + 1]
            merged, i = [], 0
            # merge every occurrence of (a, b), left to right
            while i < len(word):
                if i < len(word) - 1 and word[i] == a and word[i + 1] == b:
                    merged.append(a + b); i += 2
                else:
                    merged.append(word[i]); i += 1
            word = merged
        ids = []
        for sym in word:
            tid = self.vocab.get(sym)
            if tid is None:  # not in the vocabulary: one token per byte
                ids.extend(self.vocab[ch] for ch in sym)
            else:
                ids.append(tid)
        if len(self._cache) < 100_000:
            self._cache[piece] = ids
        return ids

    def _split_special(self, text: str) -> list[tuple[str, bool]]:
        parts, start, i, n = [], 0, 0, len(text)
        first = self._special_first
        while i < n:
            cands = first.get(text[i])
            if cands:
                for t in cands:  # longest first
                    if text.startswith(t, i):
                        if i > start:
                            parts.append((text[start:i], False))
                        parts.append((t, True))
                        i = start = i + len(t)
                        break
                else:
                    i += 1
            else:
                i += 1
        if start < n:
            parts.append((text[start:], False))
        return parts

    def encode(self, text: str, *, special: bool = True, add_bos: bool | None = None) -> list[int]:
        """Token ids of text. special: recognise control tokens written in the
        text (<|im_start|> ...); add_bos: default from the GGUF (False for SmolLM2)."""
        ids: list[int] = []
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids.append(self.bos_id)
        parts = self._split_special(text) if special and self.special else [(text, False)]
        for part, is_special in parts:
            if is_special:
                ids.append(self.special[part])
                continue
            for piece in pre_tokenize(part, self.pre):
                ids.extend(self._bpe(piece))
        return ids

    # ------------------------------------------------------------ decoding
    def token_bytes(self, tid: int, *, special: bool = True) -> bytes:
        t = self.tokens[tid]
        ty = self.types[tid]
        if ty == TOKEN_CONTROL:
            return t.encode("utf-8") if special else b""
        if ty == TOKEN_USER_DEFINED:
            return t.encode("utf-8")
        dec = self.byte_dec
        try:
            return bytes(dec[c] for c in t)
        except KeyError:  # a token outside the byte alphabet: its text as is
            return t.encode("utf-8")

    def decode(self, ids: Iterable[int], *, special: bool = True) -> str:
        """Text of ids; special=False leaves control tokens out. Invalid UTF-8
        (a character cut between tokens) becomes U+FFFD."""
        return b"".join(self.token_bytes(int(i), special=special) for i in ids).decode(
            "utf-8", errors="replace")

    # ------------------------------------------------------------ chat
    def apply_chat_template(self, messages: Sequence[dict], *, add_generation_prompt: bool = True,
                            default_system: str | None = None) -> str:
        """ChatML as SmolLM2-Instruct's tokenizer.chat_template writes it:
        a default system message when the first message is not one, each
        message as <|im_start|>{role}\\n{content}<|im_end|>\\n, and
        <|im_start|>assistant\\n to ask for the reply."""
        if default_system is None:
            default_system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
        out = []
        for i, m in enumerate(messages):
            if i == 0 and m["role"] != "system" and default_system:
                out.append(f"<|im_start|>system\n{default_system}<|im_end|>\n")
            out.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
        if add_generation_prompt:
            out.append("<|im_start|>assistant\n")
        return "".join(out)

    def encode_chat(self, messages: Sequence[dict], **kw) -> list[int]:
        return self.encode(self.apply_chat_template(messages, **kw), special=True)

    def is_eog(self, tid: int) -> bool:
        """End of generation: eos (<|im_end|> for SmolLM2-Instruct) or <|endoftext|>."""
        return tid == self.eos_id or tid == self.im_end or self.tokens[tid] == "<|endoftext|>"
