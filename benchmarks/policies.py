"""Routing policies against each other in the simulator, on this machine's validated CPU
profile (``benchmarks/sim_validation.py``: TTFT p50 within ~7% of the real cluster).

Part A, cold share: the coding-agent workload of ``benchmarks/cluster.py`` (3 primed
repository contexts of 1,536 tokens, multi-turn sessions, new 2,048-token documents) with
0/10/25/50/75% of the sessions new documents; the same 3 workers as ``cpd-1d`` (warmpath's
CPD: cost-based tiers), ``pd-2p1d`` (cache-blind PD), ``pd-2p1d`` under ``pd-kv`` (one pool,
KV-aware cost: the Dynamo / llm-d style) and three prefix-aware replicas. For each: the
highest session rate sustained (that rate and every lower one met the SLO), per seed.
Part B, drift: 10% → 60% → 10% cold (a third of the run each) on 2 pre-prefill + 2 prefill
+ 2 decode workers on the simulated B200 / Llama-3.1-8B profile, elastic tiers on vs off:
warm TTFT p90 per 20 s window and the role changes.
Part C, decision time (``benchmarks/decide.py``, also runnable alone): the router's plan
(hashing, KV index lookup, model, policy; the tokenizer excluded) at 2K / 32K / 128K-token
prompts, cold and follow-up turns, p50 and p99.

SLO (stated before measuring, as ``benchmarks/cluster.py``): warm TTFT p90 ≤ 2 s, cold
TTFT p90 ≤ 20 s, ≥ 99% of requests succeed. TTFT is timed from arrival.

    python benchmarks/policies.py [--parts share,drift,decide] [--seeds 3] [--duration 300]
        [--out benchmarks/results/policies.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import cluster as real  # noqa: E402  (the workload and SLO of the real benchmark)
import decide  # noqa: E402  (part C)
import sim_validation as val  # noqa: E402  (the validated CPU profile)

from warmpath.bench.arrivals import ArrivalConfig, arrival_times  # noqa: E402
from warmpath.bench.metrics import summarize  # noqa: E402
from warmpath.bench.workload import coding_agent, fast_tokens  # noqa: E402
from warmpath.cluster.topology import Topology, resolve  # noqa: E402
from warmpath.sim.run import build  # noqa: E402

SHARES = (0.0, 0.1, 0.25, 0.5, 0.75)
RATES = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0, 1.2)
CONFIGS = {"cpd": ("cpd-1d", None), "pd": ("pd-2p1d", None), "pd-kv": ("pd-2p1d", "pd-kv"),
           "replica": (Topology("replica-3", "replica", {"replica": 3}), None)}


def workload(cold: float):
    def make(n: int, seed: int):
        return coding_agent(n, seed, primed=True, repo_seed=real.SEED, **{**real.AGENT, "warm_ratio": 1 - cold})
    return make


def point(setup, make, rate: float, duration: float, seed: int) -> bool:
    """One primed cluster at ``rate`` sessions/s: did it meet the SLO?"""
    sim = build(replace(setup, seed=seed))
    sim.run(val.primes())
    start, seen = sim.now + 1.0, len(sim.records)
    times = arrival_times(ArrivalConfig(rate, duration, seed=seed))
    sessions = make(len(times), seed)
    for s, t in zip(sessions, times):
        s.start = start + t
    recs = sim.run(sessions)[seen:]
    return real.meets(summarize(recs, max(sim.now - start, duration), {}))


def sustained(setup, make, duration: float, seed: int) -> float:
    """The highest rate of :data:`RATES` met with every lower rate met too."""
    best = 0.0
    for r in RATES:
        if not point(setup, make, r, duration, seed):
            break
        best = r
    return best


def part_share(profile, seeds: int, duration: float) -> dict:
    fitted, hw, extra, _ = profile
    out = {}
    for cold in SHARES:
        row = {}
        for name, (topo, policy) in CONFIGS.items():
            t = topo if isinstance(topo, Topology) else resolve(topo, None, policy)
            setup = replace(val.cluster_setup("cpd-1d", fitted, hw, extra), topology=t)
            got = [sustained(setup, workload(cold), duration, s) for s in range(seeds)]
            row[name] = {"runs": got, "median": statistics.median(got), "spread": [min(got), max(got)]}
        base = max(v["median"] for k, v in row.items() if k != "cpd")
        row["cpd_vs_best_baseline"] = row["cpd"]["median"] / base if base else None
        out[str(cold)] = row
        print(f"cold {cold:.0%}: " + ", ".join(f"{k} {v['median']} {v['spread']}" for k, v in row.items()
                                              if isinstance(v, dict)) + f" | cpd/best {row['cpd_vs_best_baseline']}",
              flush=True)
    return out


DRIFT = Topology("cpd-2p2p2d", "cpd", {"pre-prefill": 2, "prefill": 2, "decode": 2})
DRIFT_AGENT = dict(repos=8, context=32768, doc_tokens=32768, turns=3, question=256, answer=128)


def drift_sessions(rate: float, phase_s: float, seed: int):
    """Three phases of ``phase_s``: 10%, 60%, 10% new 32K-token documents."""
    out = []
    for k, cold in enumerate((0.1, 0.6, 0.1)):
        times = arrival_times(ArrivalConfig(rate, phase_s, seed=seed + k))
        ss = coding_agent(len(times), seed + k, primed=True, repo_seed=seed, gen=fast_tokens,
                          **{**DRIFT_AGENT, "warm_ratio": 1 - cold})
        for s, t in zip(ss, times):
            s.sid, s.start = f"p{k}-{s.sid}", k * phase_s + t
        out += ss
    return out


def part_drift(rate: float, phase_s: float, seed: int, window_s: float = 20.0) -> dict:
    from warmpath.bench.workload import Session, Turn, repo_contexts
    from warmpath.sim.profiles import HARDWARE, MODELS
    from warmpath.router.admission import AdmissionConfig
    from warmpath.sim.run import SimSetup

    out = {}
    for elastic in (True, False):
        # admission wide open: the workers' queues (what elastic tiers act on) must form, not the router's
        sim = build(SimSetup(DRIFT, MODELS["llama-3.1-8b"], HARDWARE["b200"], elastic=elastic,
                             admission=AdmissionConfig(1024, {"cold": 4096, "warm": 4096})))
        ctxs = repo_contexts(seed, DRIFT_AGENT["repos"], DRIFT_AGENT["context"], fast_tokens)
        sim.run([Session(f"prime-{i}", [Turn(c[-1:] + [1000], 1)], prefix=c[:-1], start=0.5 * i)
                 for i, c in enumerate(ctxs)])
        t0 = sim.now + 1.0
        sessions = drift_sessions(rate, phase_s, seed)
        start = {}
        for s in sessions:
            s.start += t0
            start[s.sid] = s.start - t0
        recs = [r for r in sim.run(sessions) if not r.sid.startswith("prime")]
        windows = {}
        for r in recs:
            if r.ok and r.cls == "warm":
                windows.setdefault(int(start[r.sid] // window_s), []).append(r.ttft)
        p90 = {str(k * window_s): statistics.quantiles(v, n=10)[-1] if len(v) > 1 else v[0]
               for k, v in sorted(windows.items())}
        s = summarize(recs, 3 * phase_s, {})
        out["elastic" if elastic else "static"] = {
            "warm_ttft_p90_by_window": p90, "warm_ttft_p90": s["warm"]["ttft_p90_s"],
            "cold_ttft_p90": s["cold"]["ttft_p90_s"], "failed": s["all"]["failed"],
            "role_changes": [(round(t - t0, 1), w, role) for t, w, role in sim.stats.role_changes]}
        print(f"drift elastic={elastic}: warm TTFT p90 {s['warm']['ttft_p90_s']:.3f}s, cold p90 "
              f"{s['cold']['ttft_p90_s']:.3f}s, role changes {out['elastic' if elastic else 'static']['role_changes']}",
              flush=True)
    return out


def plot_drift(drift: dict, phase_s: float, path: Path) -> None:
    """Warm TTFT p90 per window, elastic vs static, with the role changes and the phases."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    for name, d in drift.items():
        xs = [float(t) for t in d["warm_ttft_p90_by_window"]]
        ax.plot(xs, list(d["warm_ttft_p90_by_window"].values()), marker="o", ms=3, label=name)
        for t, w, role in d["role_changes"]:
            ax.axvline(t, color="tab:red", ls=":", lw=1)
            ax.annotate(f"{w} → {role}", (t, ax.get_ylim()[1] * 0.9), fontsize=7, color="tab:red")
    for k, share in enumerate(("10% cold", "60% cold", "10% cold")):
        ax.axvspan(k * phase_s, (k + 1) * phase_s, alpha=0.06 * (k % 2 + 1), color="grey")
        ax.text(k * phase_s + 3, 0.02, share, fontsize=7)
    ax.set_xlabel("session arrival (s)")
    ax.set_ylabel("warm TTFT p90 (s)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="share,drift,decide")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--duration", type=float, default=300.0, help="seconds of arrivals per rate point")
    p.add_argument("--drift-rate", type=float, default=8.0, help="sessions/s in the drift run")
    p.add_argument("--drift-phase", type=float, default=120.0, help="seconds per phase of the drift run")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/policies.json"))
    a = p.parse_args()
    res = {"slo": {"warm_ttft_p90_s": real.SLO["warm"], "cold_ttft_p90_s": real.SLO["cold"], "success": 0.99},
           "command": " ".join(sys.argv)}
    if "share" in a.parts:
        prof = val.cpu_profile(Path("benchmarks/results/cluster/calibration_insitu.json"),
                               Path("benchmarks/results/cluster/calibration_traced.json"),
                               Path("benchmarks/results/request_overhead.json"),
                               Path("benchmarks/results/answer_retokenize.json"))
        res["share"] = part_share(prof, a.seeds, a.duration)
    if "drift" in a.parts:
        res["drift"] = part_drift(a.drift_rate, a.drift_phase, 0)
        plot_drift(res["drift"], a.drift_phase, a.out.with_name(a.out.stem + "_drift.png"))
    if "decide" in a.parts:
        res["decide"] = decide.part_decide()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
