"""The process tree of a cluster that a benchmark started (``warmpath serve`` as a new session):
its members, when it is ready, and stopping it with nothing left behind. Used by
``memory.py``, ``soak.py`` and ``chaos.py``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx


def children() -> dict[int, list[int]]:
    """ppid -> pids, for every process visible in /proc now."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            kids.setdefault(ppid, []).append(int(d.name))
    return kids


def tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    kids, out, todo = children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(sorted(kids.get(pid, [])))
    return out


def cmdline(pid: int) -> list[str]:
    """The argv of ``pid`` (raises OSError when it is gone)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]


def wait_ready(proc: subprocess.Popen, base: str, auth: dict, n: int, timeout: float) -> None:
    """Until the router lists ``n`` workers; raises if the launcher exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"warmpath serve exited with code {proc.returncode}")
        try:
            if len(httpx.get(base + "/v1/cluster", timeout=5, headers=auth).json()["workers"]) >= n:
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(1.0)
    raise RuntimeError(f"workers not registered after {timeout:.0f} s")


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot), to tell it from a reused PID; None
    when it is gone or a zombie (exited, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] == "Z" else int(fields[19])


def stop(proc: subprocess.Popen, seen: dict[int, int]) -> list[str]:
    """SIGTERM the launcher's group and wait; then SIGKILL any process of its tree (``seen``:
    pid -> start time) still alive. Returns those it had to kill (``"pid command line"``)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    time.sleep(1.0)
    left = []
    for pid, t0 in seen.items():
        if pid != proc.pid and t0 is not None and start_time(pid) == t0:
            with contextlib.suppress(OSError):
                left.append(f"{pid} {' '.join(cmdline(pid))[:120]}")
                os.kill(pid, signal.SIGKILL)
    return left
