"""Per-request outcomes of one simulated ``benchmarks/policies/real_policies.py`` sweep, with the router's
decisions: for each request its class, worker, predicted vs simulated TTFT, every worker's
queued prompt tokens at dispatch and the policy's score per candidate (TTFT + harm).

The sweep is the real benchmark's procedure on the validated CPU profile
(``sim_validation.simulate_sweep``: primed, the rates one after another on one cluster,
``agent(n, SEED + int(rate*1000))`` with arrivals seeded by ``SEED``).

    python -m benchmarks.policies.diag_rate [--topology cpd-1d] [--rates 0.15,0.2,0.25,0.3] [--show 0.2]
        [--seeds 0,1,2] [--duration 90] [--out /tmp/diag.json]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from benchmarks.common import workload as real
from benchmarks.sim_accuracy import sim_validation as val

from warmpath.bench.arrivals import ArrivalConfig, arrival_times
from warmpath.bench.metrics import summarize
from warmpath.launch.topology import Topology, resolve
from warmpath.routing.estimate import estimate
from warmpath.routing.policy import CPDPolicy, harm_s, tier_class
from warmpath.sim.run import build

CONFIGS = {"cpd": ("cpd-1d", None), "cpd-dynamic": ("cpd-1d", "dynamic"), "pd": ("pd-2p1d", None),
           "pd-kv": ("pd-2p1d", "pd-kv"), "replica": (Topology("replica-3", "replica", {"replica": 3}), None)}


def profile():
    return val.cpu_profile(Path("benchmarks/results/cluster/calibration_insitu.json"),
                           Path("benchmarks/results/cluster/calibration_traced.json"),
                           Path("benchmarks/results/request_overhead.json"),
                           Path("benchmarks/results/answer_retokenize.json"))


def setup_for(name: str, prof, seed: int, cpd=None):
    fitted, hw, extra, _ = prof
    topo, arg = CONFIGS[name]
    if isinstance(topo, Topology):
        t = topo
    elif arg == "dynamic":
        t = resolve(topo, "dynamic", None)
    else:
        t = resolve(topo, None, arg)
    s = replace(val.cluster_setup("cpd-1d", fitted, hw, extra), topology=t, seed=seed)
    return replace(s, cpd=cpd) if cpd is not None else s


def instrument(sim) -> dict:
    """Wrap the decider and the client: a row per request, filled at plan, dispatch and end."""
    rows: list[dict] = []
    plan, ended = sim.decider.decide_route, sim.client.ended
    cur = {}

    def planned(rv, snap, allow_local=True, arrival=True):
        d = plan(rv, snap, allow_local, arrival)
        cand = {}
        if isinstance(sim.decider.policy, CPDPolicy):
            cfg = sim.decider.policy.cfg
            for w in snap.by_role("pre-prefill", "prefill"):
                e = estimate(w, rv, snap)
                h = cfg.harm_weight * harm_s(w, e, snap) * cfg.slo(d.cls) / cfg.slo(tier_class(w))
                cand[w.worker_id] = {"ttft": round(e.ttft_s, 3), "harm": round(h, 3), "q_s": round(e.queue_s, 3)}
        cur["plan"] = {"t": snap.now, "d": d, "queued": {w.worker_id: w.queued_prefill_tokens for w in snap.workers},
                       "running": {w.worker_id: w.running for w in snap.workers}, "cand": cand,
                       "lam": {k: round(v, 3) for k, v in snap.arrivals_s.items()}}
        return d

    def done(now, req, error=None):
        rec = ended(now, req, error)
        p = req.__dict__.get("_plan")
        rows.append({"rid": req.rid, "arrival": req.arrival, "admitted": req.admitted, "rec": rec, "plan": p,
                         "prompt": len(req.prompt), "second": req.__dict__.get("_second")})
        return rec

    dispatch = sim._dispatch

    def dispatched(req, d):
        req.__dict__["_plan"] = cur.pop("plan", None)
        return dispatch(req, d)

    token = sim._decode_token

    def decoded(req, seq, finished):   # the second token: the first event with text if the first had none
        if req.first_at is not None and "_second" not in req.__dict__:
            req.__dict__["_second"] = sim.now - req.arrival
        return token(req, seq, finished)

    sim.decider.decide_route, sim.client.ended, sim._dispatch, sim._decode_token = planned, done, dispatched, decoded
    return rows


def router_load(sim) -> None:
    """Give the policy the real router's queue view (``routing/load.py`` as ``router/flow.py``
    feeds it): a prefill worker's queued tokens are the uncached tokens (as estimated at
    dispatch) of the prefills sent to it and not yet answered; a worker computing the prompt
    itself (replica, PPD-local) holds them until its first token."""
    book: dict[str, int] = {}
    dispatch, done, token = sim._dispatch, sim._prefill_done, sim._decode_token

    def dispatched(req, d):
        w = d.prefill if d.prefill is not None else d.decode
        n = req.rv.num_tokens - d.cached_tokens
        book[w] = book.get(w, 0) + n
        req.__dict__["_book"] = (w, n)
        return dispatch(req, d)

    def release(req):
        w, n = req.__dict__.pop("_book", (None, 0))
        if w is not None:
            book[w] -= n

    def prefilled(req, seq):
        release(req)
        return done(req, seq)

    def decoded(req, seq, finished):
        if req.first_at is None:
            release(req)
        return token(req, seq, finished)

    from dataclasses import replace as _r
    for w in sim.workers.values():
        orig = w.view
        w.view = (lambda o=orig, wid=w.wid: _r(o(), queued_prefill_tokens=book.get(wid, 0)))
    sim._dispatch, sim._prefill_done, sim._decode_token = dispatched, prefilled, decoded


ROUTER_LOAD = False
OBS_NOISE = 0.0


def noisy_observations(sim, cv: float) -> None:
    """Scatter the prefill times the router's model learns from (seeded log-normal, mean 1):
    what a busy 2-core machine adds to a short prefill's measured time."""
    import math
    import random
    from dataclasses import replace as _r
    rng, sigma = random.Random(1), math.sqrt(math.log1p(cv * cv))
    observe = sim.decider.observe_prefill

    def observed(o, view):
        f = math.exp(rng.gauss(-sigma * sigma / 2, sigma))
        extra = (o.worker_s - o.queue_s) * (f - 1)
        return observe(_r(o, worker_s=o.worker_s + extra, round_trip_s=o.round_trip_s + extra), view)
    sim.decider.observe_prefill = observed


def sweep(setup, rates: list[float], duration: float):
    sim = build(setup)
    if ROUTER_LOAD:
        router_load(sim)
    if OBS_NOISE:
        noisy_observations(sim, OBS_NOISE)
    rows = instrument(sim)
    sim.run(val.primes())
    out = {}
    for rate in rates:
        start, seen = sim.now + 1.0, len(sim.records)
        print(f"  model before rate {rate}: " + "; ".join(f"{w}: {m.params()}" for w, m in sim.decider.model.workers.items()))
        times = arrival_times(ArrivalConfig(rate, duration, seed=real.SEED))
        sessions = real.agent(len(times), real.SEED + int(rate * 1000))
        for s, t in zip(sessions, times):
            s.start = start + t
        recs = sim.run(sessions)[seen:]
        summ = summarize(recs, max(sim.now - start, duration), real.TARGET)
        reqs = rows[seen:]
        out[rate] = {"summary": summ, "start": start, "requests": sorted(reqs, key=lambda r: r["arrival"]),
                     "meets": real.meets(summ), "role_changes": list(sim.stats.role_changes)}
    return out


def line(r: dict, t0: float) -> str:
    rec, p = r["rec"], r["plan"]
    d = p["d"] if p else None
    q = " ".join(f"{k[:6]}={v}" for k, v in sorted(p["queued"].items()) if not k.startswith("decode")) if p else ""
    c = " ".join(f"{k[:6]}:{v['ttft']}+{v['harm']}" for k, v in sorted(p["cand"].items())) if p and p["cand"] else ""
    return (f"{r['rid']:<16} t={r['arrival'] - t0:7.2f} {rec.cls:<4} n={r['prompt']:<5} cached={rec.cached_tokens:<5} "
            f"-> {(d.prefill or '-') if d else '?':<13} {d.cls if d else '':<4} pred={d.est_ttft_s if d else 0:6.2f} "
            f"ttft={rec.ttft if rec.ttft is not None else float('nan'):6.2f} 2nd={r['second'] or float('nan'):5.2f} wait={r['admitted'] - r['arrival']:5.2f} "
            f"| q {q} | {c} | lam {p['lam'] if p else ''}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="cpd", choices=list(CONFIGS))
    p.add_argument("--rates", default="0.15,0.2,0.25,0.3")
    p.add_argument("--show", default="0.2", help="rates whose requests to list")
    p.add_argument("--seeds", default="0,1,2", help="seeds of the step scatter")
    p.add_argument("--duration", type=float, default=90.0)
    p.add_argument("--harm", default="", help="CPDConfig overrides, k=v,k=v (e.g. harm_weight=0)")
    p.add_argument("--router-load", action="store_true",
                   help="the policy sees the real router's queue view (routing/load.py), not the workers' schedulers")
    p.add_argument("--obs-noise", type=float, default=0.0,
                   help="coefficient of variation of the prefill times the router's model learns from")
    p.add_argument("--quiet", action="store_true", help="summaries only")
    a = p.parse_args()
    prof = profile()
    global ROUTER_LOAD
    ROUTER_LOAD = a.router_load
    global OBS_NOISE
    OBS_NOISE = a.obs_noise
    from warmpath.routing.policy import CPDConfig
    cpd = CPDConfig(**{k: float(v) for k, v in (x.split("=") for x in a.harm.split(",") if x)}) if a.harm else None
    rates = [float(x) for x in a.rates.split(",")]
    show = [float(x) for x in a.show.split(",") if x]
    for seed in (int(x) for x in a.seeds.split(",")):
        res = sweep(setup_for(a.config, prof, seed, cpd), rates, a.duration)
        for rate, r in res.items():
            c = r["summary"]
            routed = {}
            for q in r["requests"]:
                if q["plan"]:
                    k = q["plan"]["d"].prefill or q["plan"]["d"].decode
                    routed[k] = routed.get(k, 0) + 1
            f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
            w2 = sorted(q["second"] or q["rec"].ttft for q in r["requests"] if q["rec"].ok and q["rec"].cls == "warm")
            second = f" | warm 2nd-token p90 {w2[min(len(w2) - 1, int(0.9 * len(w2)))]:.2f}" if w2 else ""
            print(f"{a.config} seed {seed} rate {rate}: warm p50 {f(c['warm']['ttft_p50_s'])} p90 "
                  f"{f(c['warm']['ttft_p90_s'])} n={c['warm']['completed']} | cold p50 {f(c['cold']['ttft_p50_s'])} "
                  f"p90 {f(c['cold']['ttft_p90_s'])} n={c['cold']['completed']} | failed {c['all']['failed']} | "
                  f"SLO {'met' if r['meets'] else 'MISSED'}{second} | prefill at {routed} | roles {r['role_changes']}",
                  flush=True)
            if rate in show and not a.quiet:
                for q in r["requests"]:
                    print("   ", line(q, r["start"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
