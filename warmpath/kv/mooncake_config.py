"""How a worker reaches Mooncake Store (:class:`MooncakeConfig`), what its L3 client counts
(:class:`L3Stats`), and Mooncake's log level.

NOTE: no torch, no Mooncake import here.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class MooncakeConfig:
    """Where the store is and how this client talks to it."""

    master: str                      # "host:port" of mooncake_master's RPC
    metadata: str                    # "http://host:port/metadata"
    protocol: str = "tcp"            # or "rdma"
    device: str = ""                 # RDMA device names ("" = auto)
    local_hostname: str = "127.0.0.1"
    global_segment_bytes: int = 0    # memory this client lends to the store
    local_buffer_bytes: int = 64 << 20
    staging_blocks: int = 32
    op_timeout_s: float = 2.0
    retry_after_s: float = 2.0

    def __post_init__(self) -> None:
        if ":" not in self.master:
            raise ValueError(f"master must be host:port, got {self.master!r}")
        if not self.metadata.startswith("http"):
            raise ValueError(f"metadata must be an http URL, got {self.metadata!r}")
        if self.staging_blocks <= 0:
            raise ValueError("staging_blocks must be > 0")


@dataclass
class L3Stats:
    """What the L3 client did (blocks unless named bytes or seconds)."""

    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    blocks_written: int = 0
    errors: int = 0          # failed calls (RPC errors, timeouts)
    corrupt: int = 0         # blocks that failed verification (treated as misses)
    fallbacks: int = 0       # lookups answered "miss" because L3 was down
    rejected_full: int = 0   # puts refused because the store was full (not an error)
    busy_skips: int = 0      # puts put off (or spills dropped) while an overlapped get held the path
    read_seconds: float = 0.0
    write_seconds: float = 0.0


def quiet_mooncake_logs(level: int) -> None:
    """Route Mooncake's glog output to our log level (call before the first import)."""
    name = "INFO" if level <= logging.INFO else "WARNING" if level <= logging.WARNING else "ERROR"
    os.environ.setdefault("MC_LOG_LEVEL", name)
    os.environ.setdefault("MC_YLT_LOG_LEVEL", name.lower().replace("warning", "warn"))
    os.environ.setdefault("GLOG_minloglevel", {"INFO": "0", "WARNING": "1", "ERROR": "2"}[name])
