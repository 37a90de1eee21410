"""A vLLM worker's load: what its server's ``/metrics`` says (running, waiting, KV usage,
prefix cache counters, its KV pool's size) and what the relay saw itself (prompt tokens of
requests still waiting for their first token, the measured prefill speed), as the
:class:`~warmpath.protocol.internal.Heartbeat` the router reads.

vLLM's metric names (v1 engine): ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc`` (older: ``vllm:gpu_cache_usage_perc``), the counters
``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` (tokens) and the info gauge
``vllm:cache_config_info`` whose labels carry ``num_gpu_blocks`` and ``block_size``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from warmpath.protocol.internal import Heartbeat

USAGE_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


@dataclass(frozen=True)
class VLLMMetrics:
    """One reading of a vLLM server's ``/metrics`` (summed over its label sets)."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    prefix_queries: float = 0.0      # prompt tokens looked up in its prefix cache
    prefix_hits: float = 0.0         # of which found
    num_blocks: int | None = None    # its KV pool, in blocks
    block_size: int | None = None

    @property
    def kv_tokens(self) -> int | None:
        """Tokens its KV pool holds (``None`` when the info gauge is missing)."""
        return self.num_blocks * self.block_size if self.num_blocks and self.block_size else None


def parse_metrics(text: str) -> VLLMMetrics:
    """Read the samples this module uses from a Prometheus exposition (``ValueError`` when
    it is not one)."""
    sums: dict[str, float] = {}
    info: dict[str, str] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.startswith("vllm:"):
                continue
            sums[s.name] = sums.get(s.name, 0.0) + s.value
            if s.name == "vllm:cache_config_info":
                info = dict(s.labels)

    def as_int(v: str | None) -> int | None:
        try:
            return int(v) if v not in (None, "", "None") else None
        except ValueError:
            return None

    usage = next((sums[n] for n in USAGE_NAMES if n in sums), 0.0)
    return VLLMMetrics(running=int(sums.get("vllm:num_requests_running", 0)),
                       waiting=int(sums.get("vllm:num_requests_waiting", 0)),
                       kv_usage=min(1.0, max(0.0, usage)),
                       prefix_queries=sums.get("vllm:prefix_cache_queries_total", 0.0),
                       prefix_hits=sums.get("vllm:prefix_cache_hits_total", 0.0),
                       num_blocks=as_int(info.get("num_gpu_blocks")), block_size=as_int(info.get("block_size")))


class RelayBook:
    """What the relay knows that vLLM's metrics do not say: prompt tokens of requests not yet
    at their first token, the prefill speed measured from answers (tokens computed, not
    cached, over the time to the first token; an exponential mean) and the batch each
    request decodes in: the mean of vLLM's running requests at each ``/metrics`` reading
    while it decoded (before any reading: the relay's own requests decoding when its first
    token came, itself included). Thread-safe."""

    def __init__(self, prefill_tok_s: float = 500.0, alpha: float = 0.2) -> None:
        if not prefill_tok_s > 0 or not 0 < alpha <= 1:
            raise ValueError("need prefill_tok_s > 0 and 0 < alpha <= 1")
        self.prefill_tok_s, self.alpha = prefill_tok_s, alpha
        self.pending: dict[str, int] = {}
        self.decoding: dict[str, list] = {}     # rid -> [Σ running read, readings, relay's own count]
        self._lock = threading.Lock()

    def started(self, rid: str, prompt_tokens: int) -> None:
        with self._lock:
            self.pending[rid] = prompt_tokens

    def first_token(self, rid: str) -> None:
        with self._lock:
            self.pending.pop(rid, None)
            self.decoding[rid] = [0.0, 0, len(self.decoding) + 1]

    def finished(self, rid: str, computed_tokens: int | None = None, ttft: float | None = None) -> float:
        """``computed_tokens`` / ``ttft``: the prompt tokens vLLM computed and the seconds to the
        first token (both known only for a whole answer; a speed from < 64 tokens is noise).
        Returns the batch the request decoded in (1 if it never decoded); a second call: 1."""
        with self._lock:
            self.pending.pop(rid, None)
            d = self.decoding.pop(rid, None)
            if computed_tokens is not None and ttft and computed_tokens >= 64:
                speed = computed_tokens / ttft
                self.prefill_tok_s += self.alpha * (speed - self.prefill_tok_s)
        if d is None:
            return 1.0
        return d[0] / d[1] if d[1] else float(d[2])

    def heartbeat(self, worker_id: str, m: VLLMMetrics) -> Heartbeat:
        """The heartbeat of reading ``m`` (also a batch reading for the requests decoding)."""
        with self._lock:
            queued = sum(self.pending.values())
            for d in self.decoding.values():
                d[0] += max(1, m.running)
                d[1] += 1
        return Heartbeat(worker_id=worker_id, queued_prefill_tokens=queued, running=m.running + m.waiting,
                         kv_usage=m.kv_usage, prefill_tok_s=max(1e-3, self.prefill_tok_s))
