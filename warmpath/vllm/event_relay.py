"""vLLM's KV events → warmpath's: a thread that reads the vLLM server's batches (a SUB socket
bound on loopback, which vLLM's PUB connects to), re-keys them (``kv/vllm_events.py``) and
publishes them on a :class:`~warmpath.kv.events.KVEventPublisher` of its own, which the
router subscribes to exactly as it does to warmpath's workers (cluster-token auth, replay).

So the router's ``GlobalKVIndex`` needs nothing vLLM-specific, vLLM's socket never leaves
the host, and a fleet mixing both engines is one kind of event stream to the router.

The relay also keeps :attr:`EventRelay.truth` (``kv/vllm_truth.py``): the blocks vLLM's events
say it has cached, re-keyed or not, which index fidelity is measured against.
"""

from __future__ import annotations

import logging
import threading

from warmpath.kv.events import AllBlocksCleared, KVEventPublisher
from warmpath.kv.hashing import KVNamespace
from warmpath.kv.vllm_events import VLLMEventSubscriber, VLLMKeyRebuilder
from warmpath.kv.vllm_truth import VLLMCacheTruth

log = logging.getLogger(__name__)


class EventRelay:
    """Binds ``vllm_endpoint`` (default: a free loopback port; :attr:`vllm_endpoint` says
    which, for vLLM's ``--kv-events-config``), publishes re-keyed batches on ``host:port``
    (advertised as ``advertise_host``). ``start`` announces ``AllBlocksCleared`` first, as
    warmpath's workers do: the router forgets what an earlier life of this worker held."""

    def __init__(self, namespace: KVNamespace, worker_id: str, host: str = "127.0.0.1", port: int = 0,
                 advertise_host: str | None = None, token: str | None = None,
                 vllm_endpoint: str = "tcp://127.0.0.1:*", vllm_replay: str | None = None) -> None:
        self.sub = VLLMEventSubscriber(vllm_endpoint, vllm_replay)
        self.rebuilder = VLLMKeyRebuilder(namespace)
        self.truth = VLLMCacheTruth()
        self.pub = KVEventPublisher(worker_id, host=host, port=port, advertise_host=advertise_host, token=token)
        self.batches = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="vllm-events")

    @property
    def vllm_endpoint(self) -> str:
        return self.sub.endpoint

    def start(self) -> "EventRelay":
        self.pub.publish([AllBlocksCleared()])
        self._thread.start()
        return self

    def step(self, timeout_ms: int = 200) -> int:
        """One pass: read what vLLM sent, fold it into :attr:`truth`, publish it re-keyed;
        returns the batches read."""
        got = self.sub.poll(timeout_ms)
        for _, events in got:
            out = self.rebuilder.translate(events)
            self.truth.apply(events, self.rebuilder.keys.get)
            if out:
                self.pub.publish(out)
        self.batches += len(got)
        return len(got)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # noqa: BLE001 - one bad pass must not end the relay
                self.errors += 1
                log.exception("vLLM KV events: pass failed")
                self._stop.wait(0.2)

    def stats(self) -> dict[str, float]:
        """Counters for ``/metrics``: batches read, replays, lost / malformed batches, and the
        rebuilder's counts (blocks keyed, removed, orphans, refused), the blocks vLLM has cached."""
        s = self.rebuilder.stats
        return {"batches": self.batches, "replays": self.sub.replays, "lost_batches": self.sub.lost,
                "malformed_batches": self.sub.malformed, "errors": self.errors, "stored_blocks": s.stored,
                "removed_blocks": s.removed, "orphan_blocks": s.orphans, "bad_block_size": s.bad_block_size,
                "bad_tokens": s.bad_tokens, "other_medium": s.other_medium, "cached_blocks": len(self.truth)}

    def cached(self) -> dict:
        """:class:`~warmpath.protocol.internal.CachedBlocks`' fields: what vLLM has cached by
        its events (:attr:`truth`), with the batches lost or unreadable so far."""
        return {"worker_id": self.pub.worker_id, **self.truth.snapshot(), "lost_batches": self.sub.lost,
                "malformed_batches": self.sub.malformed}

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self.sub.close()
        self.pub.close()
