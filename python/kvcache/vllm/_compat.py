"""The vLLM release check every module of the connector runs before it
imports anything from vLLM: a release this connector was not written
against fails at import with a message saying so."""
from __future__ import annotations

import os

import vllm

from . import SUPPORTED_VLLM


def check_version() -> None:
    v = getattr(vllm, "__version__", "?")
    if os.environ.get("KVCACHE_VLLM_ANY_VERSION") == "1":
        return
    if not any(v == s or v.startswith(s + ".") for s in SUPPORTED_VLLM):
        raise ImportError(
            f"kvcache.vllm: vLLM {v} is not supported (this connector supports vLLM "
            f"{', '.join(s + '.x' for s in SUPPORTED_VLLM)}: its KV connector API and "
            "per-layer KV views). Install a supported vLLM, or set "
            "KVCACHE_VLLM_ANY_VERSION=1 to try anyway.")


check_version()
