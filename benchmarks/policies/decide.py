"""Router decision time (``benchmarks/policies/sim_policies.py`` part C): block hashes, KV index lookups
and ``RouteDecider.decide_route`` with the learnt model and the CPD policy, the tokenizer excluded, as the
router's handler runs them (``BlockHashCache.hashes`` then the decider's snapshot and route decision).
The prompt comes as the handler holds it after tokenizing: a compact ``array('I')``
(``kv.hashing.token_array``, made in the tokenizer's thread). What making that array from the
tokenizer's list costs is reported apart (``to_array_ms``, cold prompts), not in the total.

Three workers (pre-prefill ``c0``, prefill ``p0``, decode ``d0``); the index holds the first
half of the prompt's blocks in ``p0``'s L1 and all of them in L3 (as before this split).

* **cold**: a prompt the router has never hashed, the index's lookups the first since those
  blocks' events (nothing certified yet: every held block is checked once);
* **follow-up**: the session's previous prompt (decided just before, untimed) plus 64..1,024
  new tokens: the hashes of the common blocks are reused, the certified run is found by
  binary search.

Per prompt size: p50 / p99 of the hash part, the index + plan part (and apart: the index
lookups, made by the snapshot, and the plan, ``decide_route``), and their sum. The
machine's load average is recorded with them: times taken beside other busy processes are
upper bounds (a p99 then mostly measures the scheduler).

    python -m benchmarks.policies.decide [--iters 200] [--sizes 2048,32768,131072]
        [--out benchmarks/results/policies_decide.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from warmpath.kv.events import BlockStored
from warmpath.kv.hash_cache import BlockHashCache
from warmpath.kv.hashing import NATIVE, KVNamespace, hash_prefix_blocks, token_array
from warmpath.routing.index import GlobalKVIndex
from warmpath.routing.policy import CPDPolicy
from warmpath.routing.route import RouteDecider
from warmpath.routing.views import WorkerView

NS = KVNamespace(model_id="m", revision="r", dtype="float32", block_size=16)
VIEWS = [WorkerView("c0", "pre-prefill"), WorkerView("p0", "prefill"), WorkerView("d0", "decode")]


def indexed(hashes: list[bytes]) -> GlobalKVIndex:
    """An index with the first half of ``hashes`` in p0's L1 and all of them in L3."""
    index = GlobalKVIndex()
    index.apply("p0", [BlockStored(hashes[: len(hashes) // 2], None, [], NS.block_size, "L1")], 0.0)
    index.apply("c0", [BlockStored(hashes, None, [], NS.block_size, "L3")], 0.0)
    return index


def decide(cache: BlockHashCache, index: GlobalKVIndex, decider: RouteDecider, ids,
           sid: str) -> tuple[float, float, float]:
    """One decision, timed: (hash, index lookups (the snapshot), plan (``decide_route``)) seconds."""
    t0 = time.perf_counter()
    hs = cache.hashes(NS, ids, sid)
    t1 = time.perf_counter()
    rv = decider.request_view(len(ids), hs, NS.block_size, sid, None, 128)
    snap = decider.snapshot(VIEWS, lambda w: index.lookup(w, hs, 0.0), None, 46080, 0.0)
    t2 = time.perf_counter()
    decider.decide_route(rv, snap, arrival=False)
    return t1 - t0, t2 - t1, time.perf_counter() - t2


def quantiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    q = lambda p: round(xs[min(len(xs) - 1, int(p * len(xs)))] * 1000, 4)
    return {"p50": q(0.5), "p99": q(0.99)}


def summary(times: list[tuple[float, float, float]]) -> dict:
    return {"hash_ms": quantiles([a for a, _, _ in times]), "index_plan_ms": quantiles([b + c for _, b, c in times]),
            "lookup_ms": quantiles([b for _, b, _ in times]), "plan_ms": quantiles([c for _, _, c in times]),
            "total_ms": quantiles([sum(t) for t in times])}


def to_array(ids: list[int]) -> tuple[object, float]:
    """The tokenizer's list as the handler keeps it (``array('I')``), and what that took."""
    t0 = time.perf_counter()
    arr = token_array(ids)
    return arr, time.perf_counter() - t0


def run_size(n: int, iters: int) -> dict:
    rng = np.random.default_rng(n)
    decider, cache = RouteDecider(CPDPolicy()), BlockHashCache()
    cold, packing = [], []
    for i in range(iters):
        ids, dt = to_array(rng.integers(0, 50000, n).tolist())
        packing.append(dt)
        index = indexed(hash_prefix_blocks(NS, ids))
        cold.append(decide(cache, index, decider, ids, f"cold-{i}"))
    base = token_array(rng.integers(0, 50000, n).tolist())
    index, follow = indexed(hash_prefix_blocks(NS, base)), []
    for i in range(iters):
        decide(cache, index, decider, base, "s")              # the previous turn, untimed
        ids = base + token_array(rng.integers(0, 50000, int(rng.integers(64, 1025))).tolist())
        follow.append(decide(cache, index, decider, ids, "s"))
    return {"cold": summary(cold), "follow_up": summary(follow), "to_array_ms": quantiles(packing)}


def part_decide(iters: int = 200, sizes: tuple[int, ...] = (2048, 32768, 131072)) -> dict:
    """Cold and follow-up decision times per prompt size (printed as they come)."""
    out = {"iters": iters, "block_size": NS.block_size, "python": platform.python_version(),
           "cpus": os.cpu_count(), "loadavg_1m_before": round(os.getloadavg()[0], 2), "native_chain": NATIVE}
    for n in sizes:
        r = out[str(n)] = run_size(n, iters)
        for kind in ("cold", "follow_up"):
            s = r[kind]
            print(f"decide {n} tokens {kind}: total p50 {s['total_ms']['p50']:.3f} p99 {s['total_ms']['p99']:.3f} ms "
                  f"(hash {s['hash_ms']['p50']:.3f}/{s['hash_ms']['p99']:.3f}, index+plan "
                  f"{s['index_plan_ms']['p50']:.3f}/{s['index_plan_ms']['p99']:.3f}: lookups "
                  f"{s['lookup_ms']['p50']:.3f}/{s['lookup_ms']['p99']:.3f}, plan "
                  f"{s['plan_ms']['p50']:.3f}/{s['plan_ms']['p99']:.3f})", flush=True)
        print(f"decide {n} tokens: list -> array('I') p50 {r['to_array_ms']['p50']:.3f} "
              f"p99 {r['to_array_ms']['p99']:.3f} ms (tokenizer thread, not in the totals)", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--sizes", default="2048,32768,131072")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/policies_decide.json"))
    a = p.parse_args()
    res = {"command": " ".join(sys.argv), "decide": part_decide(a.iters, tuple(int(x) for x in a.sizes.split(",")))}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
