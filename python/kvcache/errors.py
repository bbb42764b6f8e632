"""Errors of the kvcache package: KvError and the stable codes of the C API
(client/kvcache.h)."""
from __future__ import annotations

import errno as _errno

from ._native import lib as _lib

# Errors the daemon reports (client/kvcache.h): -(1000 + the protocol's code).
EINVAL = -1001
ENOSPC = -1002
ENOENT = -1003
ESTALE = -1004
EPERM = -1005
EPROTO = -1006
EVERSION = -1007
EEXIST = -1008
E2BIG = -1009
EINTERNAL = -1010
ESTATE = -1011
ESHUTDOWN = -1012
EIO = -1013
ECONFIG = -1016
EACCES = -1017
EQUOTA = -1018
EAGAIN = -1019

_NAMES = {v: "KV_" + k for k, v in globals().items() if k.startswith("E") and isinstance(v, int)}

# A call past its deadline (Connection.set_timeout()): the library's, -errno.
ETIMEDOUT = -_errno.ETIMEDOUT


class KvError(Exception):
    """A failed call. ``code``: the C API's negative code (``kvcache.ENOSPC``,
    ... or -errno); ``name``: "KV_ENOSPC", "EPIPE", ...; ``message``: the
    daemon's message when it sent one, else the library's description."""

    def __init__(self, code: int, message: str = "", call: str = ""):
        self.code = code
        if code in _NAMES:
            self.name = _NAMES[code]
        else:
            self.name = _errno.errorcode.get(-code, str(code))
        self.message = message or strerror(code)
        self.call = call
        super().__init__(f"{call + ': ' if call else ''}{self.name}: {self.message}")


def strerror(code: int) -> str:
    """The library's description of an error code."""
    return _lib.kvc_strerror(code).decode("utf-8", "replace")
