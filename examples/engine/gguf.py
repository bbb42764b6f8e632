"""A GGUF reader and dequantizer in plain Python + numpy.

GGUF (llama.cpp's model file, versions 2 and 3, little-endian):

    u32 magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
    kv_count  x  (string key, u32 value_type, value)
    tensor_count x (string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset)
    padding to `general.alignment` (default 32)
    tensor data; each tensor at data_start + offset

A string is a u64 byte length and UTF-8 bytes; an array value is a u32 element
type, a u64 count and the elements. dims list the fastest-varying dimension
first (ggml's ne[0]), so the numpy shape is the reverse: a matrix of ne =
[n_in, n_out] is a numpy (n_out, n_in) array whose rows are the outputs.

The file is mapped (mmap) and tensors are numpy views of it until they are
dequantized. `dequantize()` turns the raw blocks of F32, F16, BF16, F64, the
integer types, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K into float32,
vectorised over all blocks at once (no Python loop per block).
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Metadata value types.
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, \
    UINT64, INT64, FLOAT64 = range(13)

_SCALAR = {  # value type -> numpy dtype (little-endian)
    UINT8: np.dtype("<u1"), INT8: np.dtype("<i1"), UINT16: np.dtype("<u2"),
    INT16: np.dtype("<i2"), UINT32: np.dtype("<u4"), INT32: np.dtype("<i4"),
    FLOAT32: np.dtype("<f4"), BOOL: np.dtype("<u1"), UINT64: np.dtype("<u8"),
    INT64: np.dtype("<i8"), FLOAT64: np.dtype("<f8"),
}

# ggml tensor types: id -> (name, elements per block, bytes per block).
QK_K = 256
GGML_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 2 + 16),
    3: ("Q4_1", 32, 2 + 2 + 16),
    6: ("Q5_0", 32, 2 + 4 + 16),
    7: ("Q5_1", 32, 2 + 2 + 4 + 16),
    8: ("Q8_0", 32, 2 + 32),
    9: ("Q8_1", 32, 4 + 4 + 32),
    10: ("Q2_K", QK_K, QK_K // 16 + QK_K // 4 + 2 + 2),
    11: ("Q3_K", QK_K, QK_K // 8 + QK_K // 4 + 12 + 2),
    12: ("Q4_K", QK_K, 2 + 2 + 12 + QK_K // 2),
    13: ("Q5_K", QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),
    14: ("Q6_K", QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
    15: ("Q8_K", QK_K, 4 + QK_K + QK_K // 8),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    30: ("BF16", 1, 2),
}
GGML_TYPE_ID = {name: tid for tid, (name, _, _) in GGML_TYPES.items()}


class GGUFError(ValueError):
    """The file is not a GGUF file this reader understands."""


@dataclass
class Tensor:
    name: str
    type_id: int
    shape: tuple[int, ...]   # numpy order (slowest first): reversed GGUF dims
    offset: int              # from the start of the tensor data section
    data: np.ndarray         # raw uint8 bytes, a view of the mapped file

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.type_id][0]

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def n_bytes(self) -> int:
        return self.data.nbytes

    def dequantize(self) -> np.ndarray:
        """float32 array of self.shape."""
        return dequantize(self.data, self.type_id, self.shape)


class _Cursor:
    def __init__(self, buf: memoryview):
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError(f"truncated GGUF file at byte {self.pos} (need {n} more)")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, vtype: int):
        dt = _SCALAR[vtype]
        v = np.frombuffer(self.take(dt.itemsize), dtype=dt)[0]
        if vtype == BOOL:
            return bool(v)
        return float(v) if dt.kind == "f" else int(v)

    def u32(self) -> int:
        return struct.unpack_from("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack_from("<Q", self.take(8))[0]

    def string(self) -> str:
        n = self.u64()
        return bytes(self.take(n)).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALAR:
            return self.scalar(vtype)
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            etype = self.u32()
            count = self.u64()
            if etype in _SCALAR:
                dt = _SCALAR[etype]
                arr = np.frombuffer(self.take(count * dt.itemsize), dtype=dt)
                return arr.astype(bool) if etype == BOOL else arr.copy()
            if etype == STRING:
                out = []
                buf, pos = self.buf, self.pos
                end = len(buf)
                for _ in range(count):
                    if pos + 8 > end:
                        raise GGUFError("truncated GGUF string array")
                    n = int.from_bytes(buf[pos:pos + 8], "little")
                    pos += 8
                    if pos + n > end:
                        raise GGUFError("truncated GGUF string array")
                    out.append(bytes(buf[pos:pos + n]).decode("utf-8", errors="replace"))
                    pos += n
                self.pos = pos
                return out
            if etype == ARRAY:
                return [self.value(ARRAY) for _ in range(count)]
            raise GGUFError(f"unknown GGUF array element type {etype}")
        raise GGUFError(f"unknown GGUF value type {vtype}")


class GGUFReader:
    """Reads a GGUF file: `metadata` (dict key -> value; arrays of numbers are
    numpy arrays, arrays of strings lists), `tensors` (dict name -> Tensor, in
    file order), `version`, `alignment`, `data_offset`."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
            try:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as e:  # empty file
                raise GGUFError(f"{path}: not a GGUF file ({e})") from None
        buf = memoryview(self._mm)
        self._buf = np.frombuffer(self._mm, dtype=np.uint8)
        c = _Cursor(buf)
        if bytes(c.take(4)) != GGUF_MAGIC:
            raise GGUFError(f"{path}: not a GGUF file (bad magic)")
        self.version = c.u32()
        if self.version not in (2, 3):
            if self.version & 0xFFFF == 0 and self.version != 0:
                raise GGUFError(f"{path}: big-endian GGUF files are not supported")
            raise GGUFError(f"{path}: GGUF version {self.version} not supported (2 or 3)")
        n_tensors = c.u64()
        n_kv = c.u64()
        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, int] = {}
        for _ in range(n_kv):
            key = c.string()
            vtype = c.u32()
            self.metadata[key] = c.value(vtype)
            self.metadata_types[key] = vtype
        self.alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise GGUFError(f"{path}: general.alignment {self.alignment} is not a power of 2")
        infos = []
        for _ in range(n_tensors):
            name = c.string()
            n_dims = c.u32()
            if n_dims > 8:
                raise GGUFError(f"{path}: tensor {name} has {n_dims} dimensions")
            dims = [c.u64() for _ in range(n_dims)]
            type_id = c.u32()
            offset = c.u64()
            infos.append((name, dims, type_id, offset))
        self.data_offset = -(-c.pos // self.alignment) * self.alignment
        self.tensors: dict[str, Tensor] = {}
        for name, dims, type_id, offset in infos:
            if type_id not in GGML_TYPES:
                raise GGUFError(f"{path}: tensor {name} has unknown ggml type {type_id}")
            _, blk, nbytes = GGML_TYPES[type_id]
            n = int(np.prod(dims, dtype=np.int64)) if dims else 1
            if dims and dims[0] % blk:
                raise GGUFError(f"{path}: tensor {name}: row of {dims[0]} not a multiple of {blk}")
            size = n // blk * nbytes
            start = self.data_offset + offset
            if offset % self.alignment or start + size > len(self._buf):
                raise GGUFError(f"{path}: tensor {name} lies outside the file or is misaligned")
            self.tensors[name] = Tensor(name, type_id, tuple(reversed(dims)), offset,
                                        self._buf[start:start + size])

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def close(self) -> None:
        """Drops the mapping. Tensor.data views must not be used afterwards."""
        self.tensors.clear()
        self._buf = None
        try:
            self._mm.close()
        except BufferError:  # views still exported; the GC unmaps later
            pass

    def __enter__(self) -> "GGUFReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------- dequantization

def _f16(b: np.ndarray) -> np.ndarray:
    """(nb, 2) uint8 -> (nb, 1) float32 from little-endian float16."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(nb, 16) bytes -> (nb, 32): low nibbles are elements 0..15, high 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _q4_0(b):
    d = _f16(b[:, 0:2])
    return (_nibbles(b[:, 2:18]).astype(np.int8) - 8).astype(np.float32) * d


def _q4_1(b):
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    return _nibbles(b[:, 4:20]).astype(np.float32) * d + m


def _qh_bits(qh4: np.ndarray) -> np.ndarray:
    """(nb, 4) bytes of a little-endian u32 -> (nb, 32) bits 0..31 as uint8."""
    return np.unpackbits(qh4, axis=1, bitorder="little")


def _q5_0(b):
    d = _f16(b[:, 0:2])
    q = _nibbles(b[:, 6:22]) | (_qh_bits(b[:, 2:6]) << 4)
    return (q.astype(np.int8) - 16).astype(np.float32) * d


def _q5_1(b):
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    q = _nibbles(b[:, 8:24]) | (_qh_bits(b[:, 4:8]) << 4)
    return q.astype(np.float32) * d + m


def _q8_0(b):
    d = _f16(b[:, 0:2])
    return b[:, 2:34].view(np.int8).astype(np.float32) * d


def _q8_1(b):
    d = np.ascontiguousarray(b[:, 0:4]).view("<f4")
    return b[:, 8:40].view(np.int8).astype(np.float32) * d


def _k_scales_mins(sc: np.ndarray):
    """The 12 packed bytes of Q4_K/Q5_K -> (nb, 8) 6-bit scales and mins
    (ggml's get_scale_min_k4 for j = 0..7)."""
    sc = sc.astype(np.uint8)
    lo_s, lo_m = sc[:, 0:4] & 63, sc[:, 4:8] & 63
    hi_s = (sc[:, 8:12] & 0x0F) | ((sc[:, 0:4] >> 6) << 4)
    hi_m = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
    return (np.concatenate([lo_s, hi_s], axis=1).astype(np.float32),
            np.concatenate([lo_m, hi_m], axis=1).astype(np.float32))


def _q4_k(b):
    nb = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    s, m = _k_scales_mins(b[:, 4:16])
    qs = b[:, 16:144].reshape(nb, 4, 32)                      # 4 chunks of 64 values
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(nb, 8, 32)  # sub-block j
    return (q.astype(np.float32) * (d * s)[:, :, None] - (dmin * m)[:, :, None]).reshape(nb, QK_K)


def _q5_k(b):
    nb = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    s, m = _k_scales_mins(b[:, 4:16])
    qh = b[:, 16:48]                                         # (nb, 32)
    qs = b[:, 48:176].reshape(nb, 4, 32)
    low = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(nb, 8, 32)
    bits = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1  # (nb, 8, 32)
    q = low | (bits << 4)
    return (q.astype(np.float32) * (d * s)[:, :, None] - (dmin * m)[:, :, None]).reshape(nb, QK_K)


def _q6_k(b):
    nb = b.shape[0]
    ql = b[:, 0:128].reshape(nb, 2, 64)      # two halves of 128 values
    qh = b[:, 128:192].reshape(nb, 2, 32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32).reshape(nb, 16)
    d = _f16(b[:, 208:210])
    l0, l1 = ql[:, :, 0:32], ql[:, :, 32:64]
    q = np.stack([
        (l0 & 0x0F) | (((qh >> 0) & 3) << 4),
        (l1 & 0x0F) | (((qh >> 2) & 3) << 4),
        (l0 >> 4) | (((qh >> 4) & 3) << 4),
        (l1 >> 4) | (((qh >> 6) & 3) << 4),
    ], axis=2)                                # (nb, half, 4, 32): value 128h + 32i + l
    q = (q.astype(np.int8) - 32).astype(np.float32).reshape(nb, 16, 16)
    # scale index of value 128h + 32i + l is 8h + 2i + l // 16: 16 runs of 16 in order
    return (q * (d * sc)[:, :, None]).reshape(nb, QK_K)


_DEQUANT = {
    "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
    "Q8_1": _q8_1, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
}
_PLAIN = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I8": "<i1", "I16": "<i2",
          "I32": "<i4", "I64": "<i8"}

# Rows of blocks dequantized per step: bounds the temporaries (a few MB).
_CHUNK_BLOCKS = 1 << 16


def dequantize(raw: np.ndarray, type_id: int | str, shape) -> np.ndarray:
    """raw bytes (uint8) of a tensor of ggml type `type_id` (id or name) ->
    float32 array of `shape` (numpy order)."""
    if isinstance(type_id, str):
        type_id = GGML_TYPE_ID[type_id]
    name, blk, nbytes = GGML_TYPES[type_id]
    shape = tuple(int(s) for s in shape)
    n = int(np.prod(shape, dtype=np.int64))
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if raw.size != n // blk * nbytes or n % blk:
        raise GGUFError(f"{name}: {raw.size} bytes do not hold {n} elements")
    if name in _PLAIN:
        return raw.view(_PLAIN[name]).astype(np.float32).reshape(shape)
    if name == "BF16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    fn = _DEQUANT.get(name)
    if fn is None:
        raise GGUFError(f"dequantization of {name} is not implemented")
    blocks = raw.reshape(-1, nbytes)
    out = np.empty((blocks.shape[0], blk), dtype=np.float32)
    for i in range(0, blocks.shape[0], _CHUNK_BLOCKS):
        out[i:i + _CHUNK_BLOCKS] = fn(blocks[i:i + _CHUNK_BLOCKS])
    return out.reshape(shape)


def main(argv=None) -> int:
    """python3 gguf.py FILE: prints the metadata and the tensor table."""
    import sys
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: gguf.py FILE.gguf", file=sys.stderr)
        return 2
    r = GGUFReader(args[0])
    print(f"GGUF v{r.version}, {len(r.metadata)} keys, {len(r.tensors)} tensors, "
          f"alignment {r.alignment}, data at {r.data_offset}")
    for k, v in r.metadata.items():
        if isinstance(v, (list, np.ndarray)) and len(v) > 8:
            v = f"[{len(v)} items] {list(v[:4])}..."
        else:
            v = repr(v)
            v = v if len(v) < 200 else v[:200] + "..."
        print(f"  {k} = {v}")
    for t in r.tensors.values():
        print(f"  {t.name:32} {t.type_name:5} {str(t.shape):16} {t.n_bytes:>10} B")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
