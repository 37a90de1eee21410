"""The router's Prometheus metrics (cluster-level: what the client saw, where it went)."""

from __future__ import annotations

from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from warmpath.stats import percentile

_LAT = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128)
_TPOT = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


MAX_TENANT_LABELS = 64   # bounded label cardinality


class RouterMetrics:
    """TTFT / queue time per class (cold, warm), TPOT, prefix sources, KV moved, PPD choices.

    ``cls`` is ``warm`` when at least half of the prompt was cached at decision time,
    else ``cold``, for every policy, so CPD and PD runs compare on the same split.
    """

    def __init__(self, window: int = 2048) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("warmpath_router_requests", "Requests routed", ["route", "cls"], registry=r)
        self.failed = Counter("warmpath_router_failed_requests", "Requests that ended in an error",
                              ["stage"], registry=r)
        self.rejected = Counter("warmpath_router_rejected_requests", "Requests refused with 429", registry=r)
        self.tenant_requests = Counter("warmpath_router_tenant_requests", "Requests per tenant and outcome "
                                       "(admitted; limited: past the tenant's limit, 429; rejected: queues full, "
                                       f"429); tenants beyond the first {MAX_TENANT_LABELS} are counted as 'other'",
                                       ["tenant", "outcome"], registry=r)
        self._tenants: set[str] = set()
        self.retries = Counter("warmpath_router_retries", "Requests re-routed after a worker failed", registry=r)
        self.dropped = Counter("warmpath_router_workers_dropped", "Workers removed from routing, by why "
                               "(unhealthy: it reported its engine failed; silent: no heartbeat; "
                               "unreachable: a request to it failed; replaced: it re-registered; drained: it shut down "
                               "after its requests finished)",
                               ["reason"], registry=r)
        self.thread_errors = Counter("warmpath_router_thread_errors", "Errors survived by background loops "
                                     "(events: a KV event batch skipped; expire: an expiry pass)",
                                     ["loop"], registry=r)
        self.snapshots = Counter("warmpath_router_kv_snapshots", "Workers whose held blocks this router "
                                 "read whole when it began following their KV events (its start, their registration)",
                                 registry=r)
        self.client_errors = Counter("warmpath_router_client_errors", "Requests refused with a 4xx, by status",
                                     ["status"], registry=r)
        self.ttft = Histogram("warmpath_router_ttft_seconds", "Arrival to first token", ["cls"],
                              buckets=_LAT, registry=r)
        self.held = Histogram("warmpath_router_held_seconds", "Requests the goodput policy held before "
                              "sending (no path kept the decodes within their TPOT bound then): the time held",
                              buckets=(0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0), registry=r)
        self.queue = Histogram("warmpath_router_queue_seconds",
                               "Admission wait + the prefill engine's queue", ["cls"], buckets=_LAT, registry=r)
        self.tpot = Histogram("warmpath_router_tpot_seconds", "Time per output token after the first",
                              ["cls"], buckets=_TPOT, registry=r)
        self.prefix = Counter("warmpath_router_prefix_tokens", "Prompt tokens by where the plan finds them",
                              ["source"], registry=r)
        self.kv_bytes = Counter("warmpath_router_kv_handoff_bytes", "KV bytes handed from prefill to decode "
                                "workers through the store", registry=r)
        self.kv_put_s = Counter("warmpath_router_kv_handoff_put_seconds",
                                "Time prefill workers spent writing handoff KV", registry=r)
        self.role_changes = Counter("warmpath_router_role_changes", "Elastic tiers: workers moved to a role",
                                    ["role"], registry=r)
        self.ttft_error = Histogram("warmpath_router_ttft_error_ratio", "|predicted - measured| / measured TTFT "
                                    "(from admission) per request", buckets=(0.05, 0.1, 0.15, 0.25, 0.5, 1, 2, 4),
                                    registry=r)
        self.tpot_error = Histogram("warmpath_router_tpot_error_ratio", "|predicted - measured| / measured TPOT "
                                    "per request the router predicted it for (goodput policy)",
                                    buckets=(0.05, 0.1, 0.15, 0.2, 0.25, 0.5, 1, 2, 4), registry=r)
        self.ppd = Counter("warmpath_router_ppd_decisions", "Turn 2+ append-prefill: local or remote",
                           ["path"], registry=r)
        self.in_flight = Gauge("warmpath_router_in_flight", "Requests admitted and running", registry=r)
        self.waiting = Gauge("warmpath_router_waiting", "Requests in the admission queues", registry=r)
        self.sessions = Gauge("warmpath_router_sessions", "Conversation sessions remembered (idle ones expire)",
                              registry=r)
        self.index_blocks = Gauge("warmpath_router_index_blocks", "Block hashes in the global KV index, by set "
                                  "(local: every worker's L1/L2, from its events; l3: the store; approx: "
                                  "routed blocks assumed held while a worker's events are stale)",
                                  ["set"], registry=r)
        self.quant = Gauge("warmpath_router_latency_quantile_seconds",
                           "Recent TTFT / queue quantiles", ["metric", "cls", "q"], registry=r)
        self.recent = {(m, c): deque(maxlen=window) for m in ("ttft", "queue") for c in ("cold", "warm")}

    def first_token(self, cls: str, ttft_s: float, queue_s: float) -> None:
        self.ttft.labels(cls).observe(ttft_s)
        self.queue.labels(cls).observe(queue_s)
        self.recent[("ttft", cls)].append(ttft_s)
        self.recent[("queue", cls)].append(queue_s)

    def summary(self) -> dict:
        """p50 / p90 of the recent TTFT and queue times per class (for ``/v1/cluster``)."""
        return {f"{m}_{c}": {"p50": percentile(xs, 50), "p90": percentile(xs, 90), "n": len(xs)}
                for (m, c), xs in self.recent.items()}

    def tenant(self, name: str) -> str:
        """``name`` as a metric label: the first ``MAX_TENANT_LABELS`` tenants by name, then ``other``."""
        if name in self._tenants or len(self._tenants) < MAX_TENANT_LABELS:
            self._tenants.add(name)
            return name
        return "other"

    def render(self, in_flight: int, waiting: int, sessions: int = 0,
               index_blocks: dict[str, int] | None = None) -> bytes:
        """The exposition, with the gauges set from the router's state now."""
        self.in_flight.set(in_flight)
        self.waiting.set(waiting)
        self.sessions.set(sessions)
        for name, n in (index_blocks or {}).items():
            self.index_blocks.labels(name).set(n)
        for (m, c), xs in self.recent.items():
            for q, pct in (("0.5", 50), ("0.9", 90)):
                v = percentile(xs, pct)
                if v is not None:
                    self.quant.labels(m, c, q).set(v)
        return generate_latest(self.registry)
