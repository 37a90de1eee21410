"""Process helpers: child processes of the launcher and the private Mooncake service,
and giving freed heap memory back."""

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


def trim_heap() -> None:
    """Hand the heap memory freed so far back to the OS (after loading a model or a
    tokenizer, whose temporaries glibc would otherwise keep for the life of the process)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):   # not glibc
        pass
