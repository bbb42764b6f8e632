"""kvcached as a vLLM KV connector (docs/vllm.md).

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvcachedConnector",
        "kv_connector_module_path": "kvcache.vllm", "kv_role": "kv_both"}'

Importing this package imports nothing from vLLM: ``KvcachedConnector`` and
the classes beside it are loaded (from kvcache.vllm.connector, which checks
the installed vLLM's version) the first time they are asked for, so
``import kvcache`` and the worker-side data path (kvcache.vllm.datapath) work
without vLLM.
"""
from __future__ import annotations

# vLLM releases whose connector API, per-layer KV views and block hashes this
# connector was written and tested against.
SUPPORTED_VLLM = ("0.32", "0.33")

_LAZY = ("KvcachedConnector", "KvcachedConnectorMetadata", "KvcachedWorkerMetadata",
         "KvcachedConnectorStats")

__all__ = list(_LAZY) + ["SUPPORTED_VLLM"]


def __getattr__(name):
    if name in _LAZY:
        from . import connector
        return getattr(connector, name)
    raise AttributeError(f"module 'kvcache.vllm' has no attribute {name!r}")
