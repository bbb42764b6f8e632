"""The connector's connection to kvcached, made on first use (the scheduler
side asks for it at start, on its thread) and again after a failure: a
daemon that is down at start is picked up when it comes."""
from __future__ import annotations

import errno
import inspect
import logging
import os
import time
from typing import List, Optional, Union

import kvcache

from .identity import PoolSpec

log = logging.getLogger("kvcache.vllm")


# Errors that say the daemon is not there (or not answering): the
# connection is lost until a call gets through again. Everything else the
# daemon answered itself (full, over quota, no such block).
_TIMEDOUT = getattr(kvcache, "ETIMEDOUT", -errno.ETIMEDOUT)
_TRANSPORT = {-errno.EPIPE, -errno.ECONNREFUSED, -errno.ECONNRESET, -errno.ENOENT,
              -errno.ENOTCONN, -errno.EBADF, -errno.EIO, _TIMEDOUT, kvcache.ESHUTDOWN,
              kvcache.EPROTO}
# Refusals no retry can change: the operator has to grant the namespace.
_PERMANENT = {kvcache.EACCES, kvcache.EPERM}


def is_lost(e: BaseException) -> bool:
    """Whether a failed call says the daemon is gone (or past the call's
    deadline) rather than answering."""
    if isinstance(e, kvcache.KvError):
        return e.code in _TRANSPORT
    return isinstance(e, OSError)


class Client:
    """A kvcached connection with its pool, made lazily and again after a
    failed connect (at most once per retry interval): a daemon that is down
    at start is picked up when it comes. The library itself reconnects
    after a restart (kvcache.h).

    Logging, once per change: a WARNING when the daemon is lost (a connect
    or a call fails for want of it), an INFO when a call gets through
    again; an ERROR when the daemon refuses this uid the namespace, after
    which nothing is tried again (the operator has to grant it and the
    engine be restarted).

    Deadlines: every call has ``timeout_ms`` (extra config; default 5000)
    where the kvcache binding has per-call deadlines (``timeout_ms`` of
    ``kvcache.connect``); a call past it fails with ETIMEDOUT and the
    library drops the connection (the daemon releases its references), so
    neither a forward nor a shutdown waits on a stopped daemon for longer."""

    def __init__(self, extra: dict, spec: Union[PoolSpec, List[PoolSpec]], order, role: str):
        # spec: one PoolSpec, or one per KV cache group (their pools are
        # registered together; ``pools[g]`` is group g's, ``pool`` group
        # 0's); order likewise one physical order or one per group.
        self.specs = list(spec) if isinstance(spec, (list, tuple)) else [spec]
        self.orders = (list(order) if isinstance(order, (list, tuple))
                       else [order] * len(self.specs))
        spec, order = self.specs[0], self.orders[0]
        self.pools: list = []
        self.socket = extra.get("socket") or None
        self.namespace = extra.get("namespace") or None
        self.retry_s = float(extra.get("retry_s", 1.0))
        self.timeout_ms = int(extra.get("timeout_ms", 5000))
        self.spec, self.order, self.role = spec, order, role
        self.conn: Optional[kvcache.Connection] = None
        self.pool = None
        self._next_try = 0.0
        self.lost = False            # the daemon was lost and is not back yet
        self.refused = False         # refused for good: never tried again
        self.deadlines = False       # whether calls have a deadline (the binding's)

    def _connect(self):
        name = f"vllm-{self.role}-{os.getpid()}"
        try:
            sig = inspect.signature(kvcache.connect)
        except (TypeError, ValueError):
            sig = None
        if self.timeout_ms > 0 and sig is not None and "timeout_ms" in sig.parameters:
            self.deadlines = True
            return kvcache.connect(self.socket, self.namespace, name, timeout_ms=self.timeout_ms)
        c = kvcache.connect(self.socket, self.namespace, name)
        if self.timeout_ms > 0 and hasattr(c, "set_timeout"):
            c.set_timeout(self.timeout_ms)
            self.deadlines = True
        return c

    def get(self):
        if self.conn is not None:
            return self.conn
        if self.refused:
            return None
        now = time.monotonic()
        if now < self._next_try:
            return None
        self._next_try = now + self.retry_s
        c = None
        try:
            c = self._connect()
            pools, names = [], []
            for sp, order in zip(self.specs, self.orders):
                name, lay = sp.desc(order)
                pools.append(c.register_pool(name, sp.block_bytes, sp.block_size,
                                             dtype=sp.dtype, layout=lay, model=sp.model))
                names.append(name)
            self.pools, self.pool = pools, pools[0]
            self.conn = c
            log.info("kvcached: %s connected, pool %s (%d bytes a block)%s", self.role,
                     ", ".join(names), self.spec.block_bytes,
                     "" if self.deadlines else "; calls have no deadline (this kvcache "
                     "binding has none)")
            self.ok()
            return c
        except (kvcache.KvError, OSError) as e:
            if c is not None:
                c.close()
            if isinstance(e, kvcache.KvError) and e.code in _PERMANENT:
                self.refused = True
                log.error("kvcached: the daemon refuses uid %d the namespace %r (%s): vLLM "
                          "goes on without kvcached; the operator grants the namespace "
                          "(docs/security.md), then restart the engine. Not retried.",
                          os.getuid(), self.namespace or f"uid-{os.getuid()}", e)
                return None
            self.failed(e, connecting=True)
            return None

    def ok(self) -> None:
        """A call got through: the daemon is back if it was lost."""
        if self.lost:
            self.lost = False
            log.info("kvcached: %s: the daemon is back", self.role)

    def failed(self, e: BaseException, connecting: bool = False) -> None:
        """A call failed: one WARNING when that means the daemon is lost."""
        if not (connecting or is_lost(e)):
            log.debug("kvcached: %s: %s", self.role, e)
            return
        if not self.lost:
            self.lost = True
            log.warning("kvcached: %s: the daemon is lost (%s); vLLM goes on without it "
                        "(lookups find nothing, saves are skipped, loads are recomputed), "
                        "retrying every %.1fs", self.role, e, self.retry_s)

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None
