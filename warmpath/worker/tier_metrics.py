"""Prometheus view of the KV hierarchy (read from the engine's counters at scrape time)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from warmpath.engine.llm_engine import LLMEngine


class TierCollector(Collector):
    """Hits, misses, bytes, evictions per tier; load-vs-recompute choices; L3 errors; the
    engine's busy seconds (utilisation = its rate)."""

    def __init__(self, engine: LLMEngine, model: str) -> None:
        self.engine, self.model = engine, model

    def collect(self):
        e, m = self.engine, self.model
        pool = e.pool.stats
        hits = CounterMetricFamily("warmpath_kv_tier_hit_blocks", "Prefix blocks served per tier",
                                   labels=["model", "tier"])
        hits.add_metric([m, "L1"], pool.hits)
        miss = CounterMetricFamily("warmpath_kv_tier_miss_blocks", "Prefix blocks looked up and not found",
                                   labels=["model", "tier"])
        miss.add_metric([m, "L1"], pool.queries - pool.hits)
        evict = CounterMetricFamily("warmpath_kv_tier_evicted_blocks", "Blocks evicted per tier",
                                    labels=["model", "tier"])
        evict.add_metric([m, "L1"], pool.evictions)
        read = CounterMetricFamily("warmpath_kv_tier_read_bytes", "Bytes read per tier", labels=["model", "tier"])
        written = CounterMetricFamily("warmpath_kv_tier_written_bytes", "Bytes written per tier",
                                      labels=["model", "tier"])
        loaded = CounterMetricFamily("warmpath_kv_tier_loaded_tokens", "Prompt tokens loaded instead of computed",
                                     labels=["model", "tier"])
        choice = CounterMetricFamily("warmpath_kv_load_decisions", "Load-vs-recompute choices",
                                     labels=["model", "choice"])
        l3err = CounterMetricFamily("warmpath_kv_l3_errors", "Failed L3 calls", labels=["model"])
        l3fb = CounterMetricFamily("warmpath_kv_l3_fallbacks", "Lookups answered as misses because L3 was down",
                                   labels=["model"])
        corrupt = CounterMetricFamily("warmpath_kv_l3_corrupt_blocks", "L3 blocks rejected by header/checksum",
                                      labels=["model"])
        full = CounterMetricFamily("warmpath_kv_l3_rejected_full_blocks", "Blocks the store refused to take "
                                   "because it was full (not stored: a future miss)", labels=["model"])
        refused = CounterMetricFamily("warmpath_kv_verify_failures", "Blocks loaded from L2/L3 and refused "
                                      "by their checks (recomputed)", labels=["model", "tier", "reason"])
        secs = CounterMetricFamily("warmpath_kv_l3_seconds", "Wall time in L3 transfers", labels=["model", "op"])
        up = GaugeMetricFamily("warmpath_kv_l3_up", "1 when L3 is reachable", labels=["model"])
        busy = CounterMetricFamily("warmpath_engine_busy_seconds", "Wall time in engine steps with work "
                                   "(KV loads and write-through puts included)", labels=["model"])
        busy.add_metric([m], e.busy_seconds)
        comp = GaugeMetricFamily("warmpath_engine_compile_seconds", "Wall time the compiled decode "
                                 "step took to compile (or load from cache) at start; 0 when eager",
                                 labels=["model"])
        comp.add_metric([m], e.runner.compile_seconds)
        cap = GaugeMetricFamily("warmpath_kv_tier_capacity_bytes", "Bytes of KV each tier of this worker "
                                "holds when full", labels=["model", "tier"])
        cap.add_metric([m, "L1"], e.runner.kv_caches.numel() * e.runner.kv_caches.element_size())
        blocks = GaugeMetricFamily("warmpath_kv_tier_blocks", "KV blocks per tier now (in_use: L1 blocks held "
                                   "by requests; cached: blocks findable by hash, in use or not; capacity)",
                                   labels=["model", "tier", "state"])
        blocks.add_metric([m, "L1", "in_use"], e.pool.num_blocks - e.pool.num_free)
        blocks.add_metric([m, "L1", "cached"], e.pool.num_cached)
        blocks.add_metric([m, "L1", "capacity"], e.pool.num_blocks)
        t = e.tiers
        if t is not None:
            cap.add_metric([m, "L2"], t.l2.data.numel() * t.l2.data.element_size())
            blocks.add_metric([m, "L2", "cached"], len(t.l2.index))
            blocks.add_metric([m, "L2", "capacity"], t.l2.index.capacity)
            hits.add_metric([m, "L2"], t.stats.l2_hits)
            evict.add_metric([m, "L2"], t.stats.l2_evictions)
            read.add_metric([m, "L2"], t.l2.bytes_read)
            written.add_metric([m, "L2"], t.l2.bytes_written)
            for tier, n in t.stats.loaded_tokens.items():
                loaded.add_metric([m, tier], n)
            for c, n in t.cost.decisions.items():
                choice.add_metric([m, c], n)
            for (tier, reason), n in sorted(t.stats.verify_failures.items()):
                refused.add_metric([m, tier, reason], n)
            if t.l3 is not None:
                s = t.l3.stats
                hits.add_metric([m, "L3"], s.hits)
                miss.add_metric([m, "L3"], s.misses)
                read.add_metric([m, "L3"], s.bytes_read)
                written.add_metric([m, "L3"], s.bytes_written)
                l3err.add_metric([m], s.errors)
                l3fb.add_metric([m], s.fallbacks)
                corrupt.add_metric([m], s.corrupt)
                full.add_metric([m], s.rejected_full)
                secs.add_metric([m, "read"], s.read_seconds)
                secs.add_metric([m, "write"], s.write_seconds)
                up.add_metric([m], 1.0 if t.l3.available else 0.0)
        yield from (hits, miss, evict, read, written, loaded, choice, l3err, l3fb, corrupt, full, refused, secs, up,
                    busy, comp, cap, blocks)
