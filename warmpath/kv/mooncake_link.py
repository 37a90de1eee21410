"""The connection under :class:`~warmpath.kv.mooncake_store.MooncakeL3`: setup, the
circuit breaker (a failed call marks L3 down for ``retry_after_s``; a probe brings it back)
and the one background thread every store call runs on, so a caller waits at most
``op_timeout_s``."""

from __future__ import annotations

import logging
import socket
import time
from typing import Callable

log = logging.getLogger(__name__)


class StoreLink:
    """Connection state of a Mooncake client; the subclass owns ``cfg`` (``MooncakeConfig``),
    ``stats`` (``L3Stats``), ``staging`` (the registered buffer), ``_exec`` (one thread),
    ``_store`` and ``_down_until``."""

    def _setup(self):
        from mooncake.store import MooncakeDistributedStore

        st = MooncakeDistributedStore()
        c = self.cfg
        if rc := st.setup(c.local_hostname, c.metadata, c.global_segment_bytes, c.local_buffer_bytes,
                          c.protocol, c.device, c.master):
            raise ConnectionError(f"mooncake setup failed ({rc}) for master {c.master}")
        if rc := st.register_buffer(self.staging.ctypes.data, self.staging.nbytes):
            raise ConnectionError(f"mooncake register_buffer failed ({rc})")
        return st

    def _master_reachable(self) -> bool:
        # NOTE: Mooncake's setup() retries for ~90 s holding the GIL when the master is
        # gone, stalling the whole worker; a plain TCP connect tells us first.
        host, _, port = self.cfg.master.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=0.5):
                return True
        except OSError:
            return False

    def connect(self) -> bool:
        """(Re)connect; returns whether L3 is usable now."""
        if not self._master_reachable():
            log.warning("L3 (Mooncake) master %s unreachable; recomputing until it is back",
                        self.cfg.master)
            self._mark_down()
            return False
        try:
            self._store = self._call(self._setup, timeout=max(10.0, self.cfg.op_timeout_s))
            self._down_until = 0.0
            return True
        except Exception as e:  # noqa: BLE001
            log.warning("L3 (Mooncake) unavailable: %s", e)
            self._mark_down()
            return False

    @property
    def available(self) -> bool:
        return self._store is not None and time.monotonic() >= self._down_until

    def _mark_down(self) -> None:
        self.stats.errors += 1
        self._down_until = time.monotonic() + self.cfg.retry_after_s

    def _call(self, fn: Callable, *args, timeout: float | None = None):
        fut = self._exec.submit(fn, *args)
        return fut.result(timeout=timeout or self.cfg.op_timeout_s)

    def probe(self) -> bool:
        """If L3 is down and the retry time has come, try a cheap call to bring it back."""
        if self._store is None:
            return time.monotonic() >= self._down_until and self.connect()
        if self.available:
            return True
        if time.monotonic() < self._down_until:
            return False
        if not self._master_reachable():
            self._mark_down()
            return False
        try:
            r = self._call(self._store.is_exist, "wp/probe")
        except Exception:  # noqa: BLE001
            r = -1
        if r < 0:
            self._mark_down()
            return False
        self._down_until = 0.0
        return True

    def close(self) -> None:
        self._exec.shutdown(wait=False, cancel_futures=True)
