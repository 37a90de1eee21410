"""Time to first token of a warm prompt served from L1, L2, L3 and recomputed (one run).

Also compares warmpath's L3 read path (batched zero-copy get + header/checksum check +
copy into the L1 pool) with Mooncake's raw ``get`` and ``batch_get_into`` on the same blocks.

    .venv/bin/python benchmarks/kv_tiers.py [--tokens 4096] [--out benchmarks/results/kv_tiers.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("MC_LOG_LEVEL", "ERROR")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from warmpath.engine.tiered_kv import TierConfig  # noqa: E402
from warmpath.engine.llm_engine import EngineConfig, LLMEngine  # noqa: E402
from warmpath.engine.scheduler import SchedulerConfig  # noqa: E402
from warmpath.engine.sequence import Sequence  # noqa: E402
from warmpath.engine.sequence import SamplingParams  # noqa: E402
from warmpath.kv.mooncake_service import MooncakeService  # noqa: E402
from warmpath.kv.mooncake_store import MooncakeConfig  # noqa: E402
from warmpath.models.loader import load_model  # noqa: E402

ONE = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)


def ttft(eng: LLMEngine, prompt: list[int]) -> tuple[float, int]:
    """Seconds until the first token, and the token."""
    t0 = time.perf_counter()
    rid = eng.add_request(prompt, ONE)
    while True:
        for o in eng.step():
            if o.request_id == rid:
                return time.perf_counter() - t0, o.new_token_ids[0]


def raw_reads(svc: MooncakeService, keys: list[str], slot: int) -> dict[str, float]:
    """Mooncake's own client reading the same objects: per-key get and batch_get_into."""
    from mooncake.store import MooncakeDistributedStore

    st = MooncakeDistributedStore()
    assert st.setup("127.0.0.1", svc.metadata, 0, 64 << 20, "tcp", "", svc.master) == 0
    t0 = time.perf_counter()
    n = sum(len(st.get(k)) for k in keys)
    get_s = time.perf_counter() - t0
    buf = np.zeros(32 * slot, dtype=np.uint8)
    assert st.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    t0 = time.perf_counter()
    for i in range(0, len(keys), 32):
        chunk = keys[i:i + 32]
        res = st.batch_get_into(chunk, [buf.ctypes.data + j * slot for j in range(len(chunk))], [slot] * len(chunk))
        assert min(res) > 0
    batch_s = time.perf_counter() - t0
    st.close()
    return {"raw_get_gbps": n / get_s / 1e9, "raw_batch_get_into_gbps": n / batch_s / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/kv_tiers.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    lm = load_model("smollm2")
    prompt = lm.tokenizer.encode("Repository context: def handler(request): return cache.get(request.key)\n" * 600)
    prompt = prompt[:a.tokens]
    blocks = a.tokens // 16 + 16
    sched = SchedulerConfig(max_num_batched_tokens=a.tokens)
    res: dict = {"tokens": len(prompt)}
    with MooncakeService(segment_bytes=1 << 30) as svc:
        mc = MooncakeConfig(master=svc.master, metadata=svc.metadata, staging_blocks=32)
        tiers = TierConfig(l2_gib=0.5, l3=mc, write_policy="write-through", load_policy="always")
        a_eng = LLMEngine(EngineConfig(num_blocks=blocks, scheduler=sched, tiers=tiers), loaded=lm)
        plain = LLMEngine(EngineConfig(num_blocks=blocks, scheduler=sched, enable_prefix_caching=False),
                          loaded=lm)
        res["recompute_s"], tok0 = ttft(plain, prompt)       # no tiers at all
        del plain
        res["cold_write_through_s"], _ = ttft(a_eng, prompt)  # computes and writes to L3
        res["l1_s"], tok1 = ttft(a_eng, prompt)              # warm in L1
        a_eng.pool.evict_cached()                            # demote everything to L2
        res["l2_s"], tok2 = ttft(a_eng, prompt)
        res["l2_loaded_tokens"] = a_eng.tiers.stats.loaded_tokens["L2"]
        b_eng = LLMEngine(EngineConfig(num_blocks=blocks, scheduler=sched, tiers=TierConfig(
            l2_gib=0.5, l3=mc, load_policy="always")), loaded=lm)
        res["l3_s"], tok3 = ttft(b_eng, prompt)              # fresh worker: L3 only
        s = b_eng.tiers.l3.stats
        res["l3_loaded_tokens"] = b_eng.tiers.stats.loaded_tokens["L3"]
        res["warmpath_l3_read_gbps"] = s.bytes_read / s.read_seconds / 1e9
        seq_hashes = Sequence("k", prompt, ONE, b_eng.namespace).full_block_hashes()
        keys = [b_eng.tiers.l3.key(h) for h in seq_hashes[:(len(prompt) - 1) // 16]]
        res.update(raw_reads(svc, keys, b_eng.tiers.l3.slot))
        res["same_token_everywhere"] = len({tok0, tok1, tok2, tok3}) == 1
        for e in (a_eng, b_eng):
            e.close()
    res["speedup_l1"] = res["recompute_s"] / res["l1_s"]
    res["speedup_l2"] = res["recompute_s"] / res["l2_s"]
    res["speedup_l3"] = res["recompute_s"] / res["l3_s"]
    res["l3_read_vs_raw_get"] = res["warmpath_l3_read_gbps"] / res["raw_get_gbps"]
    res["l3_read_vs_raw_batch"] = res["warmpath_l3_read_gbps"] / res["raw_batch_get_into_gbps"]
    for k, v in res.items():
        print(f"{k:>26}: {v:.3f}" if isinstance(v, float) else f"{k:>26}: {v}")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
