"""``warmpath map cpd``'s arms, TPOT targets and goodput (pure, no torch).

* **Arms** on one cell's GPUs (the split's nodes × 4): ``cpd`` (pre-prefill + prefill nodes
  TP4, 4 TP1 decoders per D node), ``pd`` and ``pd-kv`` (the same workers, all prefill nodes
  plain prefill; ``pd-kv`` under the KV-aware single pool) and ``replica`` (one prefix-aware
  TP4 replica per node: ``2P1D`` → 3 TP4 replicas, as ``benchmarks/policies/sim_policies.py``'s
  B200 configs); ``goodput`` (CPD's workers under the path decision, ``routing/goodput.py``:
  it is judged by the target it routes for, so it runs one sweep per TPOT target);
  ``goodput-replica`` (the same decision on a hybrid layout: the cold tier's ``p // 2``
  pre-prefill nodes TP4, every other node one TP4 replica — documents computed apart,
  handed to a replica, warm turns aggregated); ``goodput-replica-e``: that layout under elastic
  roles (``--elastic roles``: the cold tier's node may turn replica while the replicas are
  full and go back when all is calm, ``routing/elastic.py``).
* **TPOT targets**: ``none`` (the repro's TTFT p90 ≤ 2 s alone) or ``k`` — the same plus a
  per-request TPOT p90 bound of ``k ×`` the cell's *unloaded* TPOT (``slo.Target``:
  at share 0.9 each request's own TPOT is bounded). The unloaded TPOT is the roofline's:
  each request of the cell's workload decoded alone (batch 1) on one B200 (TP1, the
  disaggregated arms' decoder), its mean step over its answer; the p90 over the requests.
  It is not an unloaded *run*: a PD/CPD request's TPOT also pays the decode worker's load of
  the handed-off KV, which the bound does not forgive.
* **Goodput** per arm and target: the highest rate (sessions/s per GPU) whose run attains the
  target (≥ 90% of requests within their bounds, failures missing) with every lower rate's
  attaining too (``targets.goodput``); ``sustained`` is the older check (``Target.met``: also
  ≥ 99% success and the p90s). One sweep per arm serves every target: each run is judged
  under all of them from its per-request rows.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from functools import partial

from warmpath.bench.metrics import Record
from warmpath.bench.sweep import judge
from warmpath.slo import CPD_TARGET, Target, highest_met
from warmpath.bench.workload import coding_agent, fast_tokens
from warmpath.launch.topology import Topology
from warmpath.sim.hardware import HARDWARE, MODELS
from warmpath.sim.repro import CPD_WORKLOAD, cpd_setup
from warmpath.sim.run import simulate_rate
from warmpath.sim.step_time import Roofline
from warmpath.stats import percentile

ARMS = ("cpd", "pd", "pd-kv", "replica", "goodput", "goodput-replica", "goodput-replica-e")
ELASTIC = {"goodput-replica-e": "roles"}   # arm -> its router's --elastic (others: the default)
FIXED_ARMS = ("cpd", "pd", "pd-kv", "replica")   # the default: the fixed baselines
GPUS_PER_NODE = 4                   # the blog's nodes: one TP4 prefill-type worker or four TP1 decoders
REPLICA_TP = 4
UNLOADED_SESSIONS = 200             # sessions of the cell's workload the unloaded TPOT p90 is taken over


def parse_split(spec: str) -> tuple[int, int]:
    """``"2P1D"`` → (2, 1) nodes."""
    m = re.fullmatch(r"(\d+)P(\d+)D", spec)
    if not m or int(m[1]) < 1 or int(m[2]) < 1:
        raise ValueError(f"map: a split is <p>P<d>D with p, d >= 1, got {spec!r}")
    return int(m[1]), int(m[2])


def tpot_label(x) -> str:
    """``"none"`` or a factor > 1 as its shortest form (``"2"``, ``"1.3"``)."""
    if str(x).strip().lower() == "none":
        return "none"
    try:
        k = float(x)
    except ValueError:
        raise ValueError(f"map: a TPOT target is none or a factor of the unloaded TPOT, got {x!r}") from None
    if not k >= 1:
        raise ValueError(f"map: a TPOT target factor must be >= 1 (of the unloaded TPOT), got {x!r}")
    return f"{k:g}"


def cpd_topology(split: str, arm: str) -> Topology:
    """The split's nodes as ``arm``'s workers: prefill-type TP4 (one per node), decoders four
    per node; ``replica``: one TP4 replica per node."""
    p, d = parse_split(split)
    if arm == "replica":
        return Topology(f"{split}-replica", "replica", {"replica": p + d})
    if arm in ("goodput-replica", "goodput-replica-e"):
        return Topology(f"{split}-{arm}", "goodput", {"pre-prefill": p // 2, "replica": p - p // 2 + d})
    roles = {"pre-prefill": p // 2, "prefill": p - p // 2} if arm in ("cpd", "goodput") else {"prefill": p}
    return Topology(f"{split}-{arm}", arm, {**roles, "decode": d * GPUS_PER_NODE})


def arm_setup(split: str, arm: str, max_in_flight: int | None, kv_blocks: int | None):
    """``warmpath repro cpd``'s cluster for the arm (replicas TP4)."""
    s = cpd_setup(cpd_topology(split, arm), max_in_flight)
    return replace(s, tp={**s.tp, "replica": REPLICA_TP}, kv_blocks=kv_blocks, elastic=ELASTIC.get(arm))


def cell_workload(context_tokens: int, cell: dict) -> dict:
    """The repro's coding-agent workload with the cell's cold share, document and answer."""
    return {**CPD_WORKLOAD, "context": context_tokens, "warm_ratio": 1 - cell["cold_share"],
            "doc_tokens": cell["cold_tokens"], "answer": cell["answer"]}


def request_shapes(sessions) -> list[tuple[int, int]]:
    """``(prompt tokens, answer tokens)`` of every request: a turn's prompt is the session's
    prefix, the turns before it (new tokens and answers) and its own new tokens."""
    out = []
    for s in sessions:
        history = len(s.prefix)
        for t in s.turns:
            history += len(t.new_tokens)
            out.append((history, t.max_tokens))
            history += t.max_tokens
    return out


def request_tpot(step, prompt: int, answer: int) -> float:
    """One request decoded alone: the mean batch-1 step over tokens 2..answer (context
    ``prompt + i`` for the i-th)."""
    if answer < 2:
        return 0.0
    return sum(step.step_s([(1, prompt + i)]) for i in range(1, answer)) / (answer - 1)


def unloaded_tpot(context_tokens: int, cell: dict, seed: int = 0, n: int = UNLOADED_SESSIONS) -> float:
    """The cell's unloaded TPOT p90 (s): the roofline's batch-1 decode on one B200 (TP1),
    over ``n`` sessions of the cell's workload drawn with ``seed`` (the map's)."""
    sessions = coding_agent(n, seed, gen=fast_tokens, **cell_workload(context_tokens, cell))
    step = Roofline(MODELS["llama-3.1-8b"], HARDWARE["b200"], 1)
    return percentile([request_tpot(step, p, a) for p, a in request_shapes(sessions)], 90)


def tpot_target(label: str, unloaded_s: float) -> Target:
    """``CPD_TARGET``, plus ``tpot_p90 = k × unloaded`` for a factor label."""
    if label == "none":
        return CPD_TARGET
    return Target.from_items([*CPD_TARGET.flat().items(), ("tpot_p90", float(label) * unloaded_s)])


def rejudge(run: dict, target: Target) -> dict:
    """A run's verdicts under another target, from its per-request rows."""
    recs = [Record(r["sid"], r["turn"], r["class"], r["ok"], r["ttft_s"], r["e2e_s"], r["output_tokens"],
                   r["prompt_tokens"], r["cached_tokens"], error=r["error"]) for r in run["requests"]]
    got = judge(recs, run["duration_s"], target, run["offered_rps"])
    stopped = run["sim"]["stopped_at_s"] is not None
    return {**got, "slo_met": got["slo_met"] and not stopped, "attained": got["attained"] and not stopped}


def cpd_sweep(cfg, cell: dict, arm: str, labels: tuple[str, ...]) -> dict[str, dict]:
    """One arm's sweep up the rate grid, each run judged under every TPOT target of
    ``labels``; stopped once every target has missed both checks (no higher rate can count)."""
    setup = arm_setup(cell["split"], arm, cfg.max_in_flight, cfg.kv_blocks)
    make = partial(coding_agent, gen=fast_tokens, **cell_workload(cfg.context_tokens, cell))
    unloaded = unloaded_tpot(cfg.context_tokens, cell, cfg.seed)
    targets = {lab: tpot_target(lab, unloaded) for lab in labels}
    if arm.startswith("goodput"):   # it routes for one target: a sweep per target
        if len(labels) > 1:
            return {lab: cpd_sweep(cfg, cell, arm, (lab,))[lab] for lab in labels}
        setup = replace(setup, target=targets[labels[0]])
    runs: dict[str, dict[float, dict]] = {lab: {} for lab in labels}
    t0 = time.perf_counter()
    for r in cfg.rates:
        run = simulate_rate(setup, make, r * setup.gpus, cfg.duration_s, CPD_TARGET, cfg.ramp_s, seed=cfg.seed)
        for lab, tgt in targets.items():
            got = run if lab == "none" else rejudge(run, tgt)
            a = got["classes"]["all"]
            runs[lab][r] = {"slo_met": got["slo_met"], "attained": got["attained"], "attainment": got["attainment"],
                            "ttft_p90_s": a["ttft_p90_s"], "tpot_p90_s": a["tpot_p90_s"],
                            "success_rate": a["success_rate"], "achieved_per_gpu": run["achieved_rps"] / setup.gpus}
        if all(any(not v["slo_met"] for v in rs.values()) and any(not v["attained"] for v in rs.values())
               for rs in runs.values()):
            break
    wall = time.perf_counter() - t0
    return {lab: {"goodput": highest_met(rs, "attained"), "sustained": highest_met(rs, "slo_met"),
                  "tpot_bound_s": targets[lab].flat().get("tpot_p90"), "unloaded_tpot_s": unloaded,
                  "gpus": setup.gpus, "wall_s": wall, "runs": {str(r): v for r, v in rs.items()}}
            for lab, rs in runs.items()}


def winner(goodputs: dict[str, float | None], rates: tuple) -> dict:
    """Which arm has the highest goodput: ``arms`` (all tied at the best), its ``goodput``,
    the ``runner_up``'s and a ``note`` where the grid bounds what can be said."""
    got = {a: g for a, g in goodputs.items() if g is not None}
    if not got:
        return {"arms": [], "goodput": None, "runner_up": None, "note": f"no arm sustains the lowest rate {min(rates)}"}
    best = max(got.values())
    arms = [a for a, g in goodputs.items() if g == best]
    rest = [g for g in got.values() if g < best]
    note = f"tied at the highest rate {best}: may go higher" if len(arms) > 1 and best == max(rates) else (
        f"{arms[0]} sustains the highest rate {best}: may go higher" if best == max(rates) else "")
    return {"arms": arms, "goodput": best, "runner_up": max(rest) if rest else None, "note": note}
