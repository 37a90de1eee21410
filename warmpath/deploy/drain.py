"""Draining a worker through the router before it is stopped (no Ray here): the router
gives it nothing new, the requests it has run to their end, then it may go.

``POST /internal/drain`` answers how many requests the router has on the worker (prefills,
decodes, and prefills elsewhere whose decode will come to it); a drain is over when that
count was 0 twice, ``settle_s`` apart.
"""

from __future__ import annotations

import time

import httpx


def post(router_url: str, worker_id: str, action: str, headers: dict) -> dict | None:
    """One ``/internal/drain`` call; ``None`` when the router does not know the worker."""
    r = httpx.post(router_url + "/internal/drain", json={"worker_id": worker_id, "action": action},
                   headers=headers, timeout=10)
    if r.status_code == 404:
        return None
    r.raise_for_status()
    return r.json()


def drain(router_url: str, worker_id: str, headers: dict, timeout_s: float = 300.0,
          settle_s: float = 0.5) -> float:
    """Drain ``worker_id`` and wait until it has nothing in flight; returns the seconds
    waited. On timeout the worker is resumed and ``TimeoutError`` raised (nothing stopped)."""
    start = time.monotonic()
    quiet = 0
    while True:
        state = post(router_url, worker_id, "drain", headers)
        if state is None:       # not (or no longer) registered: nothing can be in flight
            return time.monotonic() - start
        quiet = quiet + 1 if state["in_flight"] == 0 else 0
        if quiet >= 2:
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            post(router_url, worker_id, "resume", headers)
            raise TimeoutError(f"{worker_id} still has {state['in_flight']} request(s) in flight after "
                               f"{timeout_s:.0f} s; resumed it, stopped nothing")
        time.sleep(settle_s)
