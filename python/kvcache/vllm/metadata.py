"""What the connector's two sides tell each other and vLLM (pickled by
vLLM between the scheduler and the workers): this step's loads and saves,
the requests whose loads a worker finished, and the connector's counters."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from . import _compat  # noqa: F401  (the vLLM release check, before vLLM's modules)

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorMetadata, KVConnectorWorkerMetadata)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats  # noqa: E402


@dataclass
class Load:
    req_id: str
    hashes: List[bytes]        # kvcached hashes of the blocks to load, a chain
    block_ids: List[int]       # vLLM block ids to load into, same length
    async_: bool = False       # loaded off the forward, finished through get_finished
    # Several KV cache groups (vLLM's hybrid allocator): (group, hashes,
    # block ids) of each group, only the blocks vLLM holds for it (a
    # sliding-window group's blocks below its window are vLLM's null block
    # and not loaded); hashes/block_ids above are then empty.
    groups: Optional[List[Tuple[int, List[bytes], List[int]]]] = None


def _tokens_of(src, a: int, b: int) -> list:
    return src[a:b]


class TokenSlice:
    """Tokens [a, b) of a list that only ever grows at its end (a vLLM
    request's prompt_token_ids), copied where they are used rather than on
    the scheduler's thread: by the worker that seals them (in the
    scheduler's process), or when vLLM pickles the step's metadata for
    workers in other processes - the whole list when the slice is most of
    it (one pass over the tokens instead of a slice and then its pickling;
    pickle writes a list once however many slices name it), else the
    slice. A sequence of ints; unpickled, a list."""

    __slots__ = ("src", "a", "b")

    def __init__(self, src: list, a: int, b: int):
        self.src, self.a, self.b = src, a, b

    def tolist(self) -> list:
        return self.src[self.a:self.b]

    def __len__(self) -> int:
        return self.b - self.a

    def __iter__(self):
        return iter(self.src[self.a:self.b])

    def __getitem__(self, i):
        return self.src[self.a:self.b][i]

    def __eq__(self, other):
        if isinstance(other, TokenSlice):
            other = other.tolist()
        return self.tolist() == other if isinstance(other, list) else NotImplemented

    def __repr__(self) -> str:
        return f"TokenSlice({self.b - self.a} tokens)"

    def __reduce__(self):
        if 2 * (self.b - self.a) >= len(self.src):
            return (_tokens_of, (self.src, self.a, self.b))
        return (list, (self.src[self.a:self.b],))


@dataclass
class Save:
    req_id: str
    hashes: List[bytes]
    parent: Optional[bytes]    # kvcached hash before hashes[0]; None at the head
    block_ids: List[int]
    token_ids: Any             # len(hashes) * block_size: a list, or a TokenSlice
    # For kvcached's KV events, what vLLM's own BlockStored says of these
    # blocks (_event_meta): the LoRA and each block's untagged extra keys.
    lora_name: Optional[str] = None
    lora_id: Optional[int] = None
    extra_keys: Optional[List[Any]] = None
    group: int = 0             # the KV cache group (its own kvcached pool)


@dataclass
class KvcachedConnectorMetadata(KVConnectorMetadata):
    loads: List[Load] = field(default_factory=list)
    saves: List[Save] = field(default_factory=list)


@dataclass
class KvcachedWorkerMetadata(KVConnectorWorkerMetadata):
    """Requests whose loads the worker finished (or gave up on): the
    scheduler side drops the references its lookup held for them."""
    loaded: Set[str] = field(default_factory=set)

    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
        if isinstance(other, KvcachedWorkerMetadata):
            return KvcachedWorkerMetadata(self.loaded | other.loaded)
        return self


COUNTERS = ("lookups", "lookups_deferred", "lookup_hit_blocks", "lookup_failures",
             "loaded_blocks",
             "loaded_bytes", "load_errors", "saved_blocks", "saved_bytes", "save_failures",
             "load_seconds", "save_seconds")


@dataclass
class KvcachedConnectorStats(KVConnectorStats):
    """Counters since the last report: lookups and the blocks they found,
    blocks and bytes loaded and saved, load errors, saves skipped (kvcached
    down, full or refusing), and the seconds the copies took."""

    def __post_init__(self):
        for k in COUNTERS:
            self.data.setdefault(k, 0)

    def reset(self):
        self.data = {k: 0 for k in COUNTERS}

    def add(self, key: str, n) -> None:
        self.data[key] = self.data.get(key, 0) + n

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k, v in (other.data or {}).items():
            if isinstance(v, (int, float)):
                self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> Dict[str, Any]:
        d = dict(self.data)
        for what in ("load", "save"):
            s = d.get(f"{what}_seconds", 0)
            b = d.get("loaded_bytes" if what == "load" else "saved_bytes", 0)
            d[f"{what}_GBps"] = round(b / s / 1e9, 3) if s > 0 else 0.0
        return d

    def is_empty(self) -> bool:
        return not any(self.data.get(k) for k in COUNTERS)


# What each counter means on vLLM's /metrics (vllm:kvcached_<name>_total).
PROM_HELP = {
    "lookups": "Requests KvcachedConnector looked up in kvcached",
    "lookups_deferred": "Lookups answered 'ask again' (a promotion from a lower tier)",
    "lookup_hit_blocks": "Blocks kvcached's lookups found beyond vLLM's local prefix hit",
    "lookup_failures": "Lookups that failed (daemon down, refusing, past the deadline)",
    "loaded_blocks": "Blocks loaded from kvcached into vLLM's KV cache",
    "loaded_bytes": "Bytes loaded from kvcached into vLLM's KV cache",
    "load_errors": "Blocks promised and not loaded (vLLM recomputes them or fails the request)",
    "saved_blocks": "Blocks saved from vLLM's KV cache into kvcached",
    "saved_bytes": "Bytes saved from vLLM's KV cache into kvcached",
    "save_failures": "Blocks not saved (daemon down, full, refusing; a forward that raised)",
    "load_seconds": "Seconds the workers spent loading from kvcached",
    "save_seconds": "Seconds the workers spent saving to kvcached",
}


def build_prom_metrics(vllm_config, metric_types, labelnames, per_engine_labelvalues):
    """KvcachedConnector's counters on vLLM's /metrics: one Prometheus
    counter a KvcachedConnectorStats key, per engine, fed by vLLM's stat
    logger (KVConnectorProm.observe) with each interval's stats."""
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics

    class KvcachedPromMetrics(KVConnectorPromMetrics):
        def __init__(self):
            super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
            self.counters = {}
            for k in COUNTERS:
                c = self._counter_cls(name=f"vllm:kvcached_{k}", documentation=PROM_HELP[k],
                                      labelnames=self._labelnames)
                self.counters[k] = {e: c.labels(*[str(v) for v in lv])
                                    for e, lv in self.per_engine_labelvalues.items()}

        def observe(self, transfer_stats_data, engine_idx: int = 0):
            for k, per_engine in self.counters.items():
                v = (transfer_stats_data or {}).get(k)
                if isinstance(v, (int, float)) and v > 0 and engine_idx in per_engine:
                    per_engine[engine_idx].inc(v)

    return KvcachedPromMetrics()
