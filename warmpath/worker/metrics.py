"""Prometheus metrics of one worker's engine and API."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from warmpath.engine.llm_engine import LLMEngine
from warmpath.engine.request_output import RequestOutput

_LAT = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class EngineMetrics:
    """Collects request latencies (TTFT, TPOT, queue, E2E) and engine gauges."""

    def __init__(self, engine: LLMEngine, model_name: str) -> None:
        self.engine = engine
        self.registry = r = CollectorRegistry()
        lbl = ["model"]
        self.ttft = Histogram("warmpath_time_to_first_token_seconds", "TTFT", lbl, registry=r, buckets=_LAT)
        self.tpot = Histogram("warmpath_time_per_output_token_seconds", "Mean time per output token after the first",
                              lbl, registry=r, buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2))
        self.queue = Histogram("warmpath_queue_time_seconds", "Arrival to first schedule", lbl, registry=r, buckets=_LAT)
        self.e2e = Histogram("warmpath_e2e_request_latency_seconds", "Request latency", lbl, registry=r, buckets=_LAT)
        self.prompt_tokens = Counter("warmpath_prompt_tokens", "Prompt tokens", lbl, registry=r)
        self.gen_tokens = Counter("warmpath_generation_tokens", "Generated tokens", lbl, registry=r)
        self.requests = Counter("warmpath_requests", "Finished requests", lbl + ["finish_reason"], registry=r)
        self.rejected = Counter("warmpath_requests_rejected", "Requests rejected with 4xx", lbl, registry=r)
        self.running = Gauge("warmpath_num_requests_running", "Running sequences", lbl, registry=r)
        self.waiting = Gauge("warmpath_num_requests_waiting", "Waiting sequences", lbl, registry=r)
        self.kv_usage = Gauge("warmpath_kv_cache_usage_ratio", "L1 KV blocks in use (0-1)", lbl, registry=r)
        self.kv_used = Gauge("warmpath_kv_blocks_used", "L1 KV blocks held by requests (not free)", lbl, registry=r)
        self.kv_integrity = Gauge("warmpath_kv_pool_integrity", "L1 block pool invariants at the last scrape: "
                                  "1 hold, 0 broken, -1 not checked (requests running)", lbl, registry=r)
        self.hit_rate = Gauge("warmpath_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache", lbl, registry=r)
        self.hit_tokens = Gauge("warmpath_prefix_cache_hit_tokens", "Prompt tokens found cached (total)", lbl, registry=r)
        self.query_tokens = Gauge("warmpath_prefix_cache_query_tokens", "Prompt tokens looked up (total)", lbl, registry=r)
        self.preemptions = Gauge("warmpath_num_preemptions", "Preemptions (total)", lbl, registry=r)
        self.model = model_name
        from warmpath.worker.tier_metrics import TierCollector

        r.register(TierCollector(engine, model_name))

    def on_step(self, outputs: list[RequestOutput]) -> None:
        """Engine-thread hook: queue times."""
        for o in outputs:
            if o.queue_time is not None:
                self.queue.labels(self.model).observe(o.queue_time)

    def refresh(self) -> None:
        """Set the engine gauges from current state (called at scrape time)."""
        m = self.model
        s = self.engine.scheduler
        self.running.labels(m).set(len(s.running))
        self.waiting.labels(m).set(len(s.waiting))
        pool = self.engine.pool
        self.kv_usage.labels(m).set(pool.usage)
        self.kv_used.labels(m).set(pool.num_blocks - pool.num_free)
        self.kv_integrity.labels(m).set(self._integrity())
        self.hit_tokens.labels(m).set(s.prefix_hit_tokens)
        self.query_tokens.labels(m).set(s.prefix_query_tokens)
        self.hit_rate.labels(m).set(s.prefix_hit_tokens / s.prefix_query_tokens if s.prefix_query_tokens else 0.0)
        self.preemptions.labels(m).set(s.num_preemptions)

    def _integrity(self) -> int:
        """``check_integrity()`` of the L1 pool, only while the engine is idle.

        NOTE: this runs off the engine thread; a request arriving during the check may
        race it, so a 0 is worth a second scrape before it is believed."""
        s = self.engine.scheduler
        if s.running or s.waiting or s.loading:
            return -1
        try:
            self.engine.pool.check_integrity()
            return 1
        except (AssertionError, RuntimeError, KeyError):
            return 0

    def on_finish(self, ttft: float | None, e2e: float, prompt_tokens: int, completion_tokens: int,
                  reason: str) -> None:
        """API-side hook when a request ends (``reason`` may be ``abort``)."""
        m = self.model
        if ttft is not None:
            self.ttft.labels(m).observe(ttft)
            if completion_tokens > 1:
                self.tpot.labels(m).observe((e2e - ttft) / (completion_tokens - 1))
        self.e2e.labels(m).observe(e2e)
        self.prompt_tokens.labels(m).inc(prompt_tokens)
        self.gen_tokens.labels(m).inc(completion_tokens)
        self.requests.labels(m, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
