"""Child-process helpers shared by the launcher and the private Mooncake service."""

from __future__ import annotations

import signal
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (bind to 0, read, release)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def die_with_parent() -> None:
    """preexec_fn: SIGTERM this child when the process that started it dies (Linux).

    NOTE: Mooncake's client installs its own SIGTERM handler that exits without running
    Python cleanup, so a worker killed by a signal could not stop its children itself.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
