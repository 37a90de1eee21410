"""Time to first token of a warm prompt served from L1, L2, L3 and recomputed (one run).

Also compares warmpath's L3 read path (batched zero-copy get + verification + copy into
the L1 pool) with Mooncake's raw ``get`` and ``batch_get_into`` on the same blocks.

``--verify-overhead`` instead measures what the load checks of ``kv/block_codec.py`` cost:
the L3 read path (and the L2 load) of the same blocks with the checks and without them,
``--repeats`` times, alternating (no model is loaded; SmolLM2-135M's KV layout).

    .venv/bin/python -m benchmarks.engine.kv_tiers [--tokens 4096] [--out benchmarks/results/kv_tiers.json]
    .venv/bin/python -m benchmarks.engine.kv_tiers --verify-overhead --threads 1 [--repeats 3] [--inner 20] [--tokens 4096]
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

from warmpath.engine.block_manager import BlockManager  # noqa: E402
from warmpath.engine.tiered_kv import TierConfig, TieredKV  # noqa: E402
from warmpath.kv.block_codec import verify_block  # noqa: E402
from warmpath.kv.block_pool import BlockPool  # noqa: E402
from warmpath.kv.hashing import KVNamespace  # noqa: E402
from warmpath.stats import percentile  # noqa: E402
from warmpath.engine.llm_engine import EngineConfig, LLMEngine  # noqa: E402
from warmpath.engine.scheduler import SchedulerConfig  # noqa: E402
from warmpath.engine.sequence import Sequence  # noqa: E402
from warmpath.engine.sequence import SamplingParams  # noqa: E402
from warmpath.kv.mooncake_service import MooncakeService  # noqa: E402
from warmpath.kv.mooncake_store import MooncakeConfig  # noqa: E402
from warmpath.models.loader import load_model  # noqa: E402

ONE = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
NS16 = KVNamespace(model_id="bench", revision="r", dtype="float32", block_size=16)


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


def _tiers(blocks: int, mc: MooncakeConfig | None, l2_gib: float) -> tuple[TieredKV, BlockManager]:
    """A worker's tiers over a SmolLM2-135M-shaped L1 (30 layers, 3 KV heads × 64, fp32)."""
    kv = torch.randn(30, 2, blocks, 16, 3, 64)
    pool = BlockPool(blocks)
    t = TieredKV(TierConfig(l2_gib=l2_gib, l3=mc, write_mode="write-through", events=False,
                            l3_check_interval_s=0, l2_checksum=True, kv_secret="bench-secret"), kv, pool, 16)
    return t, BlockManager(pool, 16)


def _checks(t: TieredKV, on: bool) -> TieredKV:
    """The same tiers with their load checks on or off (L2's checksums were taken at put)."""
    if t.l3 is not None:
        t.l3.verify = on
    t.l2.checksum = on
    return t


def _timed_load(t: TieredKV, bm: BlockManager, tokens: list[int], n: int, l3: bool) -> float:
    """Seconds of one load of all ``n`` blocks into a fresh sequence, the request's identities
    (digests included) built inside, as a verified read needs them."""
    seq = Sequence("r", tokens, ONE, NS16)
    assert bm.allocate_slots(seq, len(tokens))
    t0 = time.perf_counter()
    got = t.load(seq, 0, 0 if l3 else n, n if l3 else 0)
    t1 = time.perf_counter()
    assert (got.l3 if l3 else got.l2) == n and not got.rejected, got
    bm.free(seq)
    return t1 - t0


def _filled(mc: MooncakeConfig, tokens: list[int], n: int) -> tuple[TieredKV, tuple, tuple]:
    """A writer that put the ``n`` blocks of ``tokens`` into L3, a fresh L3 reader, and tiers
    with the blocks in L2."""
    w, wbm = _tiers(n + 1, mc, 0)
    seq = Sequence("w", tokens, ONE, NS16)
    assert wbm.allocate_slots(seq, len(tokens))
    seq.num_computed_tokens = len(tokens)
    wbm.seal_full_blocks(seq)
    assert len(w.after_step()) == n
    t, bm = l2 = _tiers(n + 1, None, 1.0)
    s2 = Sequence("d", tokens, ONE, NS16)
    bm.allocate_slots(s2, len(tokens))
    s2.num_computed_tokens = len(tokens)
    bm.seal_full_blocks(s2)
    bm.free(s2)
    assert bm.pool.evict_cached() == n and len(t.l2.index) == n   # demoted into L2
    return w, _tiers(n + 1, mc, 0), l2


def verify_overhead(a: argparse.Namespace) -> dict:
    """L3 read and L2 load with and without the checks: ``--repeats`` repeats of ``--inner``
    back-to-back pairs (on, off; then off, on; ...) of reads of the same blocks. A repeat's GB/s
    is the size over its median read time; its overhead the median over pairs of 1 - off/on
    time, which drift and other load on the machine disturb least."""
    n = a.tokens // 16
    tokens = [int(x) for x in np.random.default_rng(0).integers(100, 49000, n * 16 + 1)]
    rows: dict[str, list[float]] = {f"{t}_{k}": [] for t in ("l3", "l2")
                                    for k in ("on_gbps", "off_gbps", "overhead_pct")}
    with MooncakeService(segment_bytes=1 << 30) as svc:
        mc = MooncakeConfig(master=svc.master, metadata=svc.metadata, staging_blocks=32)
        w, reader, l2 = _filled(mc, tokens, n)
        size = {"l3": w.l3.slot * n, "l2": w.block_bytes * n}
        for tier, (t, bm) in (("l3", reader), ("l2", l2)):   # warm-up: connections, page faults
            _timed_load(_checks(t, True), bm, tokens, n, l3=tier == "l3")
            _timed_load(_checks(t, False), bm, tokens, n, l3=tier == "l3")
        for _ in range(a.repeats):
            for tier, (t, bm) in (("l3", reader), ("l2", l2)):
                on, off = [], []
                for i in range(a.inner):
                    for v in ((True, False) if i % 2 == 0 else (False, True)):
                        (on if v else off).append(_timed_load(_checks(t, v), bm, tokens, n, l3=tier == "l3"))
                rows[f"{tier}_on_gbps"].append(size[tier] / percentile(on, 50) / 1e9)
                rows[f"{tier}_off_gbps"].append(size[tier] / percentile(off, 50) / 1e9)
                rows[f"{tier}_overhead_pct"].append(100 * percentile([1 - f / o for o, f in zip(on, off)], 50))
        out: dict = {"blocks": n, "repeats": a.repeats, "pairs": a.inner, "stored_block_bytes": w.l3.slot,
                     "payload_bytes": w.block_bytes, "check_us_per_block": _check_cost(reader[0], tokens, n)}
        for t in (w, reader[0], l2[0]):
            t.close()
    for k, xs in rows.items():
        out[k] = {"median": percentile(xs, 50), "min": min(xs), "max": max(xs), "runs": xs}
    return out


def _check_cost(t: TieredKV, tokens: list[int], n: int, tries: int = 30) -> float:
    """Microseconds per block of what a verified read adds: the request's identities (digests
    included) and the codec's check of a staged block (best of ``tries``)."""
    seq = Sequence("c", tokens, ONE, NS16)
    best_ident = best_check = float("inf")
    for _ in range(tries):
        seq.block_digests = []
        t0 = time.perf_counter()
        want = t._wants(seq, 0, n)
        best_ident = min(best_ident, (time.perf_counter() - t0) / n)
    l3 = t.l3
    view = memoryview(l3.staging[:l3.slot])                   # the last chunk's first block is staged
    h = bytes(view[44:60])
    w = next(x for x in want if x.block_hash == h)
    for _ in range(tries):
        t0 = time.perf_counter()
        verify_block(view, w, l3.dtype, l3.shape, l3.tag_key)
        best_check = min(best_check, time.perf_counter() - t0)
    return 1e6 * (best_ident + best_check)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--verify-overhead", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--inner", type=int, default=20, help="with --verify-overhead: on/off pairs per repeat")
    ap.add_argument("--kv-dtype", default="auto", choices=("auto", "float32", "float16"))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.verify_overhead:
        res = verify_overhead(a)
        print(json.dumps(res, indent=1))
        out = Path(a.out or "benchmarks/results/kv_verify.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1))
        return
    lm = load_model("smollm2")
    prompt = lm.tokenizer.encode("Repository context: def handler(request): return cache.get(request.key)\n" * 600)
    prompt = prompt[:a.tokens]
    blocks = a.tokens // 16 + 16
    sched = SchedulerConfig(max_num_batched_tokens=a.tokens)
    res: dict = {"tokens": len(prompt), "kv_dtype": a.kv_dtype}
    with MooncakeService(segment_bytes=1 << 30) as svc:
        mc = MooncakeConfig(master=svc.master, metadata=svc.metadata, staging_blocks=32)
        tiers = TierConfig(l2_gib=0.5, l3=mc, write_mode="write-through", load_mode="always")
        a_eng = LLMEngine(EngineConfig(num_blocks=blocks, scheduler=sched, kv_dtype=a.kv_dtype, tiers=tiers), loaded=lm)
        plain = LLMEngine(EngineConfig(num_blocks=blocks, scheduler=sched, kv_dtype=a.kv_dtype, enable_prefix_caching=False),
                          loaded=lm)
        res["recompute_s"], tok0 = ttft(plain, prompt)       # no tiers at all
        del plain
        res["cold_write_through_s"], _ = ttft(a_eng, prompt)  # computes and writes to L3
        res["l1_s"], tok1 = ttft(a_eng, prompt)              # warm in L1
        a_eng.pool.evict_cached()                            # demote everything to L2
        res["l2_s"], tok2 = ttft(a_eng, prompt)
        res["l2_loaded_tokens"] = a_eng.tiers.stats.loaded_tokens["L2"]
        b_eng = LLMEngine(EngineConfig(num_blocks=blocks, scheduler=sched, kv_dtype=a.kv_dtype, tiers=TierConfig(
            l2_gib=0.5, l3=mc, load_mode="always")), loaded=lm)
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
    out = Path(a.out or "benchmarks/results/kv_tiers.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
