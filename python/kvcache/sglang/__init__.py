"""kvcached as an SGLang HiCache storage backend (docs/sglang.md).

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \\
        '{"backend_name": "kvcached", "module_path": "kvcache.sglang",
          "class_name": "KvcachedStorage", "interface_v1": 1}'

Importing this package imports nothing from SGLang: ``KvcachedStorage`` is
loaded (from kvcache.sglang.storage, which checks the installed SGLang's
version) the first time it is asked for, as SGLang's StorageBackendFactory
does with ``getattr(module, class_name)``. ``pool_identity`` and ``page_key``
need no SGLang either.
"""
from __future__ import annotations

# SGLang releases whose HiCache storage API and host pools this backend was
# written and tested against.
SUPPORTED_SGLANG = ("0.5.23",)

_LAZY = ("KvcachedStorage",)
_IDENT = ("pool_identity", "page_key")

__all__ = list(_LAZY) + list(_IDENT) + ["SUPPORTED_SGLANG"]


def __getattr__(name):
    if name in _LAZY:
        from . import storage
        return getattr(storage, name)
    if name in _IDENT:
        from . import identity
        return getattr(identity, name)
    raise AttributeError(f"module 'kvcache.sglang' has no attribute {name!r}")
