"""KvcachedConnector: vLLM's KV connector API (KVConnectorBase_V1) over
kvcached (docs/vllm.md) - the facade vLLM loads, laid out as vLLM's own
connectors are: it builds the scheduler side (kvcache.vllm.scheduler) or
the worker side (kvcache.vllm.worker) for its role and hands each of vLLM's
calls to it. The pool both sides use, and the keys blocks go under, come
from kvcache.vllm.identity; what they tell each other from
kvcache.vllm.metadata.

Failures never fail a request: with kvcached down, restarting, full or
refusing, a lookup finds nothing, a save is skipped, a load reports its
blocks as errors. References are taken only by lookup, alloc and seal, and
every path that took one releases it (or the daemon dropped it with the
connection).
"""
from __future__ import annotations

import logging
import sys
from typing import Any, Dict, Optional, Set, Tuple

from . import _compat  # noqa: F401  (the vLLM release check, before vLLM's modules)

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, SupportsHMA)

from .identity import PoolSpec, dtype_name, event_meta, kv_key, pool_specs, tp_rank_size  # noqa: E402
from .metadata import (KvcachedConnectorMetadata, KvcachedConnectorStats,  # noqa: E402
                       KvcachedWorkerMetadata, Load, Save, build_prom_metrics)
from .scheduler import KvcachedScheduler  # noqa: E402
from .worker import KvcachedWorker  # noqa: E402

# The names this module had before the split (tests, users' code).
_Load, _Save, _PoolSpec = Load, Save, PoolSpec
_kh, _event_meta, _dtype_name, _tp = kv_key, event_meta, dtype_name, tp_rank_size

log = logging.getLogger("kvcache.vllm")

__all__ = ["KvcachedConnector", "KvcachedConnectorMetadata", "KvcachedWorkerMetadata",
           "KvcachedConnectorStats"]


class KvcachedConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM's KV connector over kvcached. kv_connector_extra_config:

    - ``socket``: the daemon's socket (default: $KVCACHED_SOCKET, else
      kvcached's default path);
    - ``namespace``: the kvcached namespace (tenant) to open (default: the
      uid's own);
    - ``model``: the name engines share a pool under (default: the model
      path vLLM was given) - engines serving the same weights under
      different paths set the same value here;
    - ``lookup_timeout_ms`` (default 20): how long a lookup may make the
      scheduler wait before it answers "ask again";
    - ``lookup_deadline_ms`` (default 2000): after that long without an
      answer the request goes on without kvcached;
    - ``save`` ("all", the default; "prompt"; "none"): which full blocks go
      to kvcached;
    - ``copy_engine`` ("auto"; "cupy"; "triton"; "torch") for CUDA tensors;
    - ``retry_s`` (default 1): how often to retry a daemon that is down.
    - ``timeout_ms`` (default 5000): the deadline of every call to the
      daemon (0: the client library's default, 60 s); a load past it is a
      load error, a save past it is skipped;
    - ``lookup_batch`` (default 256): how many new requests' chains one
      scheduler-side lookup asks for;
    - ``async_loads`` ("tiers", the default; "never"): hits not in
      kvcached's device pool load asynchronously (``(n, True)``, finished
      through ``get_finished``).

    Set ``"kv_load_failure_policy": "recompute"`` in the kv-transfer
    config: vLLM's default, "fail", fails a request whose load failed (a
    daemon restart); the connector warns at start when it is "fail".
    """

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self.is_scheduler = role == KVConnectorRole.SCHEDULER
        tp_rank = 0 if self.is_scheduler else tp_rank_size()[0]
        # One pool per KV cache group (vLLM's hybrid allocator gives a
        # Gemma-2-like model a full-attention and a sliding-window group);
        # configurations the connector cannot keep right are refused here.
        self.specs = pool_specs(vllm_config, kv_cache_config, self.extra, tp_rank)
        self.spec = self.specs[0]
        self.block_size = self.spec.block_size
        save_mode = str(self.extra.get("save", "all"))
        # kv_role: a consumer only loads, a producer only saves; kv_both does both.
        ktc = self._kv_transfer_config
        if not ktc.is_kv_producer:
            save_mode = "none"
        self.save_mode = save_mode
        self.connector_scheduler: Optional[KvcachedScheduler] = None
        self.connector_worker: Optional[KvcachedWorker] = None
        if self.is_scheduler:
            policy = getattr(ktc, "kv_load_failure_policy", "fail")
            if policy == "fail":
                log.warning(
                    "kvcached: kv_load_failure_policy is %r (vLLM's default): a block that "
                    "cannot be loaded from kvcached (the daemon restarted, stopped or evicted "
                    "it) fails its request instead of being recomputed; set "
                    "\"kv_load_failure_policy\": \"recompute\" in --kv-transfer-config "
                    "(docs/vllm.md)", policy)
            self.connector_scheduler = KvcachedScheduler(self.extra, self.specs, save_mode,
                                                         bool(ktc.is_kv_consumer))
        else:
            self.connector_worker = KvcachedWorker(self.extra, self.specs,
                                                   kv_cache_config.num_blocks, save_mode)

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config) -> bool:
        """Refused: vLLM's sleep mode frees the KV cache's memory and maps it
        again on wake (gpu_worker.py sleep/wake_up around
        unregister/restore_kv_caches); that the connector's copies - raw
        device addresses of vLLM's tensors - are right after a wake was not
        tested (it needs a GPU), so vLLM refuses to start an engine with
        both (config/vllm.py) rather than let it run on unchecked
        addresses."""
        return False

    # ---- scheduler side ----

    def on_new_request(self, request) -> None:
        self.connector_scheduler.on_new_request(request)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        return self.connector_scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        self.connector_scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def get_external_cache_hit_sources(self, request, num_external_tokens: int):
        return self.connector_scheduler.get_external_cache_hit_sources(request,
                                                                       num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return self.connector_scheduler.build_connector_meta(
            scheduler_output, getattr(self, "_kv_cache_manager", None))

    def update_connector_output(self, connector_output) -> None:
        self.connector_scheduler.update_connector_output(connector_output)

    def request_finished(self, request, block_ids) -> Tuple[bool, Optional[dict]]:
        return self.connector_scheduler.request_finished(request, block_ids)

    def request_finished_all_groups(self, request, block_ids) -> Tuple[bool, Optional[dict]]:
        """SupportsHMA: vLLM's hybrid allocator keeps running with the
        connector, and calls this (once, every group's block ids) instead of
        request_finished. Saves are made in the step that computes the
        blocks, so nothing waits for the request's end."""
        return self.connector_scheduler.request_finished(request, block_ids)

    @property
    def deferred(self) -> int:
        """Lookups answered "ask again" (None), ever (tests, debugging)."""
        return self.connector_scheduler.deferred

    def held_references(self) -> int:
        """References the scheduler side holds now (tests, debugging)."""
        return self.connector_scheduler.held_references()

    def drain(self) -> None:
        """Waits until the scheduler side's ops thread has done everything
        queued so far."""
        if self.connector_scheduler is not None:
            self.connector_scheduler.drain()

    # ---- worker side ----

    @property
    def layout(self):
        return self.connector_worker.layout if self.connector_worker else None

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        self.connector_worker.register_kv_caches(kv_caches)

    def unregister_kv_caches(self) -> None:
        self.connector_worker.unregister_kv_caches()

    def restore_kv_caches(self) -> None:
        self.connector_worker.restore_kv_caches()

    def bind_connector_metadata(self, connector_metadata) -> None:
        # The exception being handled when the step began (vLLM binds the
        # metadata before the forward), if any: another one being handled
        # in wait_for_save was raised by the step.
        self._exc_at_start = sys.exc_info()[1]
        super().bind_connector_metadata(connector_metadata)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        if self.has_connector_metadata():
            self.connector_worker.start_load_kv(self._get_connector_metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        # start_load_kv issued every layer's copy before the forward, on the
        # stream the forward runs on.
        return

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        # Saves copy all layers in wait_for_save: one batch per layer for all
        # of the step's blocks.
        return

    def wait_for_save(self) -> None:
        # vLLM calls this in a finally (kv_connector_model_runner_mixin.py,
        # _get_kv_connector_output): when the forward raised, the exception
        # is the one being handled here, and the step's KV was never written
        # (or half of it was): sealing it would hand other engines bytes no
        # engine computed. Such a step saves nothing.
        exc = sys.exc_info()[1]
        if exc is not None and exc is not getattr(self, "_exc_at_start", None):
            if self.has_connector_metadata():
                self.connector_worker.drop_saves(self._get_connector_metadata(), exc)
            return
        if self.has_connector_metadata():
            self.connector_worker.wait_for_save(self._get_connector_metadata())

    def get_finished(self, finished_req_ids):
        if self.connector_worker is None:
            return None, None
        return self.connector_worker.get_finished(finished_req_ids)

    def get_transfer_results(self, finished_req_ids):
        """get_finished's requests, with the asynchronous loads that failed
        as failed_recving: with several KV cache groups vLLM cannot map a
        block id to a request (block ids are per group), so a hybrid
        model's failed load fails its request's load as a whole (vLLM
        recomputes it, or fails it under kv_load_failure_policy "fail")."""
        res = super().get_transfer_results(finished_req_ids)
        if self.connector_worker is not None and hasattr(res, "failed_recving"):
            failed = self.connector_worker.take_failed_requests()
            res.failed_recving |= failed
            res.finished_recving |= failed
        return res

    def get_block_ids_with_load_errors(self) -> Set[int]:
        if self.connector_worker is None:
            return set()
        return self.connector_worker.get_block_ids_with_load_errors()

    def build_connector_worker_meta(self):
        if self.connector_worker is None:
            return None
        return self.connector_worker.build_connector_worker_meta()

    # ---- both ----

    def get_kv_connector_stats(self):
        side = self.connector_scheduler or self.connector_worker
        return side.get_kv_connector_stats()

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return build_prom_metrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return KvcachedConnectorStats(data=dict(data or {}))

    def shutdown(self) -> None:
        (self.connector_scheduler or self.connector_worker).shutdown()
