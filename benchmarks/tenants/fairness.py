"""Tenants and priorities under overload (issue 57), in the simulator and on a real cluster.

**Fairness.** A light tenant at ``L`` requests/s beside a heavy one at ``10 L``, together
``--overload`` × the fleet's capacity. The light tenant's TTFT p90 is compared with what it
gets alone (goal: within 1.2×), with VTC (the tenants named) and without (one tenant: FIFO,
the order before tenants existed). The service gap: after every dispatch, the largest
difference of VTC counters between tenants both waiting (VTC's bound: 2 × the largest
request's cost).

**Priorities.** ``--overload`` × capacity, 20% of the requests at priority -1, the rest at 0:
the urgent ones' TTFT p90 against their unloaded TTFT (a request alone; goal ≤ 1.5×), and
the workers' preemptions of a sequence more urgent than the one that needed the room (goal 0).

Capacity: the completion rate of a flood (requests/s). TTFT from arrival (open loop).
Requests: one turn, ``--prompt`` tokens, ``--answer`` tokens, unique prompts.

    python -m benchmarks.tenants.fairness --sim [--seeds 0,1,2]          # H100, Llama-3.1-8B, 2 replicas
    python -m benchmarks.tenants.fairness --real [--seeds 0,1,2]         # warmpath serve --topology replica, this CPU
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import zlib
from pathlib import Path

from warmpath.bench.arrivals import ArrivalConfig, arrival_times
from warmpath.bench.workload import Session, Turn

ROOT = Path(__file__).resolve().parents[2]


def sessions(rate: float, duration: float, seed: int, tag: str, tenant: str, priority: int, prompt: int,
             answer: int, start_id: int) -> list[Session]:
    """Poisson arrivals of unique one-turn prompts for one tenant."""
    rng = random.Random(f"{seed}-{tag}")
    out = []
    for i, t in enumerate(arrival_times(ArrivalConfig(rate, duration, seed=zlib.crc32(f"{seed}-{tag}".encode())))):
        ids = [rng.randrange(1000, 40000) for _ in range(prompt)]
        out.append(Session(f"{tag}-{start_id + i}", [Turn(ids, answer, "cold")], start=t, tenant=tenant,
                           priority=priority))
    return out


def p90(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    return None if not xs else xs[min(len(xs) - 1, int(0.9 * len(xs)))]


def by(records, pred) -> list[float]:
    return [r.ttft for r in records if r.ok and pred(r)]


def scenarios(run, capacity: float, a: argparse.Namespace, seed: int) -> dict:
    """Every run of one seed; ``run(sessions) -> (records, stats)``."""
    light = a.overload * capacity / 11
    mk = lambda rate, tag, tenant, prio=0, base=0: sessions(rate, a.duration, seed, tag, tenant, prio,  # noqa: E731
                                                            a.prompt, a.answer, base)
    out = {"capacity_req_s": round(capacity, 3), "light_rate": round(light, 4), "heavy_rate": round(10 * light, 4)}
    alone, _ = run(mk(light, "light", "light"))
    fair, gap = run(mk(light, "light", "light") + mk(10 * light, "heavy", "heavy"))
    fifo, _ = run(mk(light, "light", "default") + mk(10 * light, "heavy", "default"))
    lt = lambda r: r.sid.startswith("light")   # noqa: E731
    out["fairness"] = {"light_alone_p90_s": p90(by(alone, lt)), "light_vtc_p90_s": p90(by(fair, lt)),
                       "light_fifo_p90_s": p90(by(fifo, lt)), "heavy_vtc_p90_s": p90(by(fair, lambda r: not lt(r))),
                       "light_ok": sum(1 for r in fair if lt(r) and r.ok), "light_sent": sum(1 for r in fair if lt(r)),
                       "vtc": gap}
    f = out["fairness"]
    f["light_vtc_vs_alone"] = round(f["light_vtc_p90_s"] / f["light_alone_p90_s"], 3)
    f["light_fifo_vs_alone"] = round(f["light_fifo_p90_s"] / f["light_alone_p90_s"], 3)
    total = a.overload * capacity
    unloaded, _ = run(mk(0.05 * capacity, "probe", "default", -1))
    mixed, pre = run(mk(0.2 * total, "urgent", "default", -1) + mk(0.8 * total, "bulk", "default", 0, 10**6))
    ur = lambda r: r.sid.startswith("urgent")   # noqa: E731
    out["priority"] = {"urgent_unloaded_p90_s": p90(by(unloaded, lambda r: True)),
                       "urgent_overload_p90_s": p90(by(mixed, ur)),
                       "bulk_overload_p90_s": p90(by(mixed, lambda r: not ur(r))),
                       "urgent_ok": sum(1 for r in mixed if ur(r) and r.ok),
                       "urgent_sent": sum(1 for r in mixed if ur(r)), "stats": pre}
    p = out["priority"]
    p["urgent_vs_unloaded"] = round(p["urgent_overload_p90_s"] / p["urgent_unloaded_p90_s"], 3)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--sim", action="store_true")
    mode.add_argument("--real", action="store_true")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--duration", type=float, default=None, help="seconds of arrivals (sim 120, real 90)")
    p.add_argument("--overload", type=float, default=1.5, help="offered load / capacity")
    p.add_argument("--prompt", type=int, default=None, help="prompt tokens (sim 2048, real 128)")
    p.add_argument("--answer", type=int, default=None, help="answer tokens (sim 256, real 16)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/tenants")
    a = p.parse_args(argv)
    real = a.real
    a.duration = a.duration or (90.0 if real else 120.0)
    a.prompt, a.answer = a.prompt or (128 if real else 2048), a.answer or (16 if real else 256)
    if real:
        from benchmarks.tenants.fairness_real import Runner
    else:
        from benchmarks.tenants.fairness_sim import Runner
    runner = Runner(a)
    res = {"mode": "real" if real else "sim", "command": " ".join(["python -m benchmarks.tenants.fairness",
                                                                   *(argv or sys.argv[1:])]),
           "setup": runner.describe(), "prompt": a.prompt, "answer": a.answer, "duration_s": a.duration,
           "overload": a.overload, "seeds": []}
    try:
        for seed in (int(x) for x in a.seeds.split(",")):
            cap = runner.capacity(seed)
            got = scenarios(runner.run, cap, a, seed)
            print(json.dumps(got), flush=True)
            res["seeds"].append({"seed": seed, **got})
    finally:
        runner.close()
    for key, sub in (("light_vtc_vs_alone", "fairness"), ("light_fifo_vs_alone", "fairness"),
                     ("urgent_vs_unloaded", "priority")):
        xs = [s[sub][key] for s in res["seeds"]]
        res[key] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"fairness_{res['mode']}.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: res[k] for k in ("light_vtc_vs_alone", "light_fifo_vs_alone", "urgent_vs_unloaded")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
