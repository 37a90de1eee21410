"""Part B of ``benchmarks/policies/sim_policies.py``: drift and elastic tiers in the simulator.

10% → 60% → 10% new 32K-token documents (a third of the run each) on 2 pre-prefill + 2 prefill
+ 2 decode workers of the simulated B200 / Llama-3.1-8B profile, elastic tiers on vs off:
warm TTFT p90 per window and the role changes, and their plot.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from warmpath.bench.arrivals import ArrivalConfig, arrival_times
from warmpath.bench.metrics import summarize
from warmpath.bench.workload import coding_agent, fast_tokens
from warmpath.launch.topology import Topology
from warmpath.sim.run import build

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
    from warmpath.sim.hardware import HARDWARE, MODELS
    from warmpath.routing.admission import AdmissionConfig
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
