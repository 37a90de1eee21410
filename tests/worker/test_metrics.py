"""worker/metrics.py: the KV pool gauges a chaos run reads after the load (blocks held by
requests, the pool's invariants), on a real engine with the tiny model."""

from prometheus_client.parser import text_string_to_metric_families

from warmpath.engine.llm_engine import EngineConfig, LLMEngine
from warmpath.engine.sequence import SamplingParams
from warmpath.worker.metrics import EngineMetrics


def gauges(m: EngineMetrics) -> dict[str, float]:
    m.refresh()
    return {s.name: s.value for f in text_string_to_metric_families(m.render().decode())
            for s in f.samples if s.name in ("warmpath_kv_blocks_used", "warmpath_kv_pool_integrity")}


def test_blocks_used_and_pool_integrity(tiny):
    eng = LLMEngine(EngineConfig(num_blocks=16, block_size=16), loaded=tiny)
    m = EngineMetrics(eng, "tiny")
    assert gauges(m) == {"warmpath_kv_blocks_used": 0, "warmpath_kv_pool_integrity": 1}
    eng.add_request(list(range(1, 41)), SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    eng.step()                                   # 40 prompt tokens + 1: 3 blocks held, running
    assert gauges(m) == {"warmpath_kv_blocks_used": 3, "warmpath_kv_pool_integrity": -1}
    while eng.has_work():
        eng.step()
    assert gauges(m) == {"warmpath_kv_blocks_used": 0, "warmpath_kv_pool_integrity": 1}   # cached, not held
    eng.pool.blocks[0].ref_cnt = 1               # a leaked reference: held, yet in the free queue
    assert gauges(m) == {"warmpath_kv_blocks_used": 0, "warmpath_kv_pool_integrity": 0}
