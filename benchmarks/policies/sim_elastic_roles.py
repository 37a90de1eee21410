"""Elastic roles in the simulator: a mix that shifts between decode-heavy and prefill-heavy
phases on a ``goodput`` fleet (2 prefill + 1 decode, simulated B200 / Llama-3.1-8B),
elastic roles (``--elastic roles``) vs the CPD tiers only (``on``) vs none (``off``).

Phases of ``phase_s`` each: A (short prompts, 512-token answers: decode-heavy), B (new
32K-token documents, 4-token answers: prefill-heavy), A again. Per arm: the share of
requests within the target per phase (TTFT per class, TPOT), TTFT / TPOT p90, the role
changes and when. Run::

    python -m benchmarks.policies.sim_elastic_roles [--phase-s 40] [--rate-a 20] [--rate-b 8]
        [--kv-blocks 2500] [--slo warm.ttft_p90=2,cold.ttft_p90=20,tpot_p90=0.03] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from warmpath.bench.arrivals import ArrivalConfig, arrival_times
from warmpath.slo import Target
from warmpath.bench.workload import Session, Turn, fast_tokens, tokens
from warmpath.launch.topology import Topology
from warmpath.routing.admission import AdmissionConfig
from warmpath.sim.hardware import HARDWARE, MODELS
from warmpath.sim.run import SimSetup, build
from warmpath.stats import percentile

FLEET = Topology("goodput-2p1d", "goodput", {"prefill": 2, "decode": 1})


def shifting(phase_s: float, rate_a: float, rate_b: float, seed: int) -> list[Session]:
    """A, B, A: Poisson arrivals at ``rate_a`` / ``rate_b`` sessions per second."""
    rng, out = random.Random(seed), []
    for k, (name, rate) in enumerate((("a", rate_a), ("b", rate_b), ("a", rate_a))):
        for i, t in enumerate(arrival_times(ArrivalConfig(rate, phase_s, seed=seed + k))):
            turn = Turn(tokens(rng, 256), 512) if name == "a" else Turn(fast_tokens(rng, 32768), 4)
            out.append(Session(f"{k}{name}{i}", [turn], start=k * phase_s + t))
    return out


def run_arm(mode: str, a: argparse.Namespace) -> dict:
    target = Target.parse(a.slo)
    sim = build(SimSetup(FLEET, MODELS["llama-3.1-8b"], HARDWARE["b200"], kv_blocks=a.kv_blocks, target=target,
                         elastic=mode, admission=AdmissionConfig(1024, {"cold": 4096, "warm": 4096})))
    recs = sim.run(shifting(a.phase_s, a.rate_a, a.rate_b, a.seed))
    phases = {}
    for k in range(3):
        rs = [r for r in recs if r.sid.startswith(str(k))]
        phases[f"{k}:{'ABA'[k]}"] = {
            "n": len(rs), "failed": sum(not r.ok for r in rs),
            "attained": round(sum(target.attains(r) for r in rs) / max(1, len(rs)), 3),
            "ttft_p90_s": percentile([r.ttft for r in rs if r.ok], 90),
            "tpot_p90_s": percentile([r.tpot for r in rs if r.ok and r.tpot is not None], 90)}
    changes = [(round(c.at, 1), c.worker, c.old, c.new) for c in sim.decider.elastic.changes]
    return {"phases": phases, "role_changes": changes}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--phase-s", type=float, default=40.0)
    p.add_argument("--rate-a", type=float, default=20.0, help="sessions/s in the decode-heavy phases")
    p.add_argument("--rate-b", type=float, default=8.0, help="sessions/s in the prefill-heavy phase")
    p.add_argument("--kv-blocks", type=int, default=2500, help="L1 blocks per worker (small: KV fills)")
    p.add_argument("--slo", default="warm.ttft_p90=2,cold.ttft_p90=20,tpot_p90=0.03")
    p.add_argument("--modes", default="off,on,roles")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    res = {}
    for mode in a.modes.split(","):
        res[mode] = run_arm(mode, a)
        print(f"elastic {mode}: " + "; ".join(f"{k} attained {v['attained']} (TTFT p90 {v['ttft_p90_s'] or 0:.2f}s, "
                                              f"TPOT p90 {1e3 * (v['tpot_p90_s'] or 0):.1f}ms, failed {v['failed']})"
                                              for k, v in res[mode]["phases"].items())
              + f"; changes {res[mode]['role_changes']}", flush=True)
    if a.out:
        a.out.write_text(json.dumps({"args": vars(a) | {"out": str(a.out)}, "arms": res}, indent=1))
    return res


if __name__ == "__main__":
    main()
