"""``warmpath repro cpd|ppd``: the seeds' experiments, redrawn with the simulator.

Assumptions the seeds leave open are set here and printed with the results: the model
(Llama-3.1-8B for both by default), context and answer lengths, the warm/cold mix; for
``cpd`` each is a flag (:class:`CPDAssumptions`), as is a client-side concurrency cap.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

from warmpath.bench.metrics import ttft_from
from warmpath.bench.sweep import max_rate_from_sweep
from warmpath.slo import CPD_TARGET
from warmpath.bench.workload import coding_agent, fast_tokens, ppd_grid
from warmpath.launch.topology import Topology
from warmpath.engine.step_model import StepModel, fit_linear
from warmpath.routing.admission import AdmissionConfig
from warmpath.routing.ppd import table_from_model
from warmpath.sim.handoff import KINDS, PDHandoff
from warmpath.sim.hardware import HARDWARE, MODELS
from warmpath.sim.repro_compare import cpd_rows, markdown, ppd_rows
from warmpath.sim.run import SimSetup, sweep
from warmpath.sim.step_time import Roofline

# CPD blog: B200, prefill TP4 per node, decode DP4 per node, <= 24 in flight, 30 s ramp.
CPD_CONFIGS = {
    "2P1D": Topology("2P1D", "pd", {"prefill": 2, "decode": 4}),
    "2P2D": Topology("2P2D", "pd", {"prefill": 2, "decode": 8}),
    "CPD-1D": Topology("CPD-1D", "cpd", {"pre-prefill": 1, "prefill": 1, "decode": 4}),
    "CPD-2D": Topology("CPD-2D", "cpd", {"pre-prefill": 1, "prefill": 1, "decode": 8}),
    "3R-TP4": Topology("3R-TP4", "replica", {"replica": 3}),       # 2P1D's 12 GPUs as prefix-aware TP4 replicas
    "GP-1D": Topology("GP-1D", "goodput", {"pre-prefill": 1, "prefill": 1, "decode": 4}),   # CPD-1D's, path decision
    # CPD-1D's 12 GPUs as a TP4 cold tier beside two TP4 replicas, path decision (map arm goodput-replica)
    "GP-1C2R": Topology("GP-1C2R", "goodput", {"pre-prefill": 1, "replica": 2}),
    # the same under elastic roles: the cold tier's one node may turn replica (``routing/elastic.py``)
    "GP-1C2R-E": Topology("GP-1C2R-E", "goodput", {"pre-prefill": 1, "replica": 2}),
}
CPD_ELASTIC = {"GP-1C2R-E": "roles"}   # config -> its router's --elastic (others: the default)
CPD_WORKLOAD = dict(repos=16, context=65536, warm_ratio=0.8, doc_tokens=65536, turns=4, question=2048,
                    answer=128)


@dataclass(frozen=True)
class CPDAssumptions:
    """What ``repro cpd`` assumes where the blog is silent (defaults: :data:`CPD_WORKLOAD`).
    ``decode_tp``: GPUs per decode instance (a node holds ``4 // decode_tp``; 70B needs > 1
    to leave KV room). ``max_concurrency``: a client-side cap (requests wait in the client,
    TTFT timed from the send) instead of / besides the router's ``max_in_flight``."""

    model: str = "llama-3.1-8b"
    context_tokens: int = CPD_WORKLOAD["context"]
    doc_tokens: int = CPD_WORKLOAD["doc_tokens"]
    question_tokens: int = CPD_WORKLOAD["question"]
    cold_share: float = 0.2
    answer_tokens: int = CPD_WORKLOAD["answer"]
    decode_tp: int = 1
    max_in_flight: int = 24
    max_concurrency: int | None = None
    ramp_s: float = 30.0

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"repro cpd: --model must be one of {sorted(MODELS)}, got {self.model!r}")
        for name in ("context_tokens", "doc_tokens", "question_tokens", "answer_tokens", "max_in_flight"):
            if getattr(self, name) < 1:
                raise ValueError(f"repro cpd: {name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.cold_share < 1:
            raise ValueError(f"repro cpd: cold_share must be in [0, 1), got {self.cold_share}")
        if self.decode_tp not in (1, 2, 4):
            raise ValueError(f"repro cpd: decode_tp must be 1, 2 or 4 (a 4-GPU node), got {self.decode_tp}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"repro cpd: max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.ramp_s < 0:
            raise ValueError(f"repro cpd: ramp_s must be >= 0, got {self.ramp_s}")

    def workload(self) -> dict:
        return {**CPD_WORKLOAD, "context": self.context_tokens, "doc_tokens": self.doc_tokens,
                "question": self.question_tokens, "warm_ratio": 1 - self.cold_share, "answer": self.answer_tokens}

    def topology(self, name: str) -> Topology:
        """``name`` of :data:`CPD_CONFIGS` with ``4 // decode_tp`` decode instances per node
        (a layout without decode workers as it is)."""
        t = CPD_CONFIGS[name]
        if "decode" not in t.workers:    # replicas (TP4, one per node) only
            return t
        return replace(t, workers={**t.workers, "decode": t.workers["decode"] // self.decode_tp})

    def setup(self, name: str) -> SimSetup:
        return replace(cpd_setup(self.topology(name), self.max_in_flight), model=MODELS[self.model],
                       tp={"prefill": 4, "pre-prefill": 4, "decode": self.decode_tp, "replica": 4},
                       max_concurrency=self.max_concurrency, target=CPD_TARGET,   # goodput routes for the repro's
                       elastic=CPD_ELASTIC.get(name))


BLOG = {"2P1D": "0.75-0.8 QPS/GPU", "CPD-1D": "1.1-1.15 QPS/GPU", "gain": "+35-40%"}
# PPD paper: H100, Llama-3.1-8B, 1P3D / 2P2D / 3P1D; turn-2 TTFT -48% to -73% for x=1.
PPD_SPLITS = {"1P3D": (1, 3), "2P2D": (2, 2), "3P1D": (3, 1)}
PPD_RATES = (4.0, 12.0, 24.0)          # sessions/s, the default sweep
PAPER = {"x1_turn2_ttft_change": "-48% to -73%", "ppd_avg": "-68%",
         "bandwidth_sweep_ms": "PD 143.7 -> 170.6, PPD ~51"}


def add_parser(sub) -> None:
    r = sub.add_parser("repro", help="redraw the seeds' CPD / PPD results with the simulator")
    r.add_argument("which", choices=("cpd", "ppd"))
    r.add_argument("--duration", type=float, default=120.0, help="steady seconds per rate (the blog: 600)")
    r.add_argument("--rates", default=None, help="override the swept rates")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--jobs", type=int, default=2, help="configurations simulated in parallel")
    r.add_argument("--max-in-flight", type=int, default=24, help="cpd: router admission limit (the blog's 24)")
    r.add_argument("--configs", default="2P1D,2P2D,CPD-1D,CPD-2D,3R-TP4", help="cpd: which configurations")
    d = CPDAssumptions()
    r.add_argument("--model", default=d.model, help="cpd: model profile (sim/hardware.py)")
    r.add_argument("--context-tokens", type=int, default=d.context_tokens, help="cpd: a repository's shared context")
    r.add_argument("--doc-tokens", type=int, default=d.doc_tokens, help="cpd: a new (cold) document")
    r.add_argument("--question-tokens", type=int, default=d.question_tokens, help="cpd: a question")
    r.add_argument("--cold-share", type=float, default=d.cold_share, help="cpd: share of sessions on new documents")
    r.add_argument("--answer-tokens", type=int, default=d.answer_tokens, help="cpd: tokens per answer")
    r.add_argument("--decode-tp", type=int, default=d.decode_tp, help="cpd: GPUs per decode instance (1, 2, 4)")
    r.add_argument("--max-concurrency", type=int, default=None,
                   help="cpd: client-side cap (requests wait in the client; TTFT from the send)")
    r.add_argument("--ramp", type=float, default=d.ramp_s, help="cpd: ramp seconds before the steady window")
    r.add_argument("--pd-handoff", choices=KINDS, default="warmpath",
                   help="ppd: vllm = the paper's baseline (TTFT at D's first token, P recomputes turn 2+)")
    r.add_argument("--handoff-extra-ms", type=float, default=0.0, help="ppd: fixed cost per P->D handoff")
    r.add_argument("--request-overhead-ms", type=float, default=0.0, help="ppd: router/HTTP time per request")
    r.add_argument("--out", type=Path, default=None)
    r.add_argument("--report-only", action="store_true",
                   help="redraw --out's repro.json: seed-vs-ours table (compare.md) and the seed figure")
    r.set_defaults(fn=main)


def ppd_table_for(hw, model, tp: int = 1):
    """A PPD table for dynamic mode from the roofline (what `calibrate` measures on CPUs)."""
    rt = Roofline(model, hw, tp)
    pre = [(t, c, rt.step_s([(t, c)])) for t in (64, 256, 1024, 4096) for c in (0, 2048, 8192)]
    dec = [(b, c, rt.step_s([(1, c)] * b)) for b in (1, 8, 32) for c in (512, 4096, 16384)]
    sm = StepModel(fit_linear(pre), fit_linear(dec))
    return table_from_model(sm, model.kv_bytes_per_token, hw.nic_bytes_s, hw.nic_bytes_s), sm


def cpd_setup(topology: Topology, in_flight: int | None = None) -> SimSetup:
    """The blog's cluster for ``topology``: B200, Llama-3.1-8B, prefill-type workers TP4 (one
    per node), decode TP1 (four per node), ``in_flight`` admitted (``None``: sized to the fleet,
    the queues scaled with it; a fixed limit keeps 256-deep queues) (``warmpath map`` too)."""
    queues = None if in_flight is None else {"cold": 256, "warm": 256}
    return SimSetup(topology, MODELS["llama-3.1-8b"], HARDWARE["b200"], tp={"prefill": 4, "pre-prefill": 4},
                    admission=AdmissionConfig(in_flight, queues))


def _cpd_config(name: str, rates: list[float], duration: float, seed: int, asm: CPDAssumptions) -> dict:
    s = asm.setup(name)
    make = partial(coding_agent, gen=fast_tokens, **asm.workload())
    summ = sweep(s, make, [r * s.gpus for r in rates], duration, CPD_TARGET, name, "coding-agent",
                 asm.ramp_s, seed)
    summ.pop("requests", None)   # repro keeps its table, not every request
    summ["rates"] = {str(r): summ["rates"][k] for r, k in zip(rates, summ["rates"])}
    summ["runs"] = {str(r): summ["runs"][k] for r, k in zip(rates, summ["runs"])}
    summ["max_rate_meeting_slo"] = max_rate_from_sweep({r: summ["runs"][str(r)] for r in rates})
    return summ


def assumptions_from_args(a: argparse.Namespace) -> CPDAssumptions:
    return CPDAssumptions(a.model, a.context_tokens, a.doc_tokens, a.question_tokens, a.cold_share, a.answer_tokens,
                          a.decode_tp, a.max_in_flight, a.max_concurrency, a.ramp)


def repro_cpd(a: argparse.Namespace, out: Path) -> dict:
    asm = assumptions_from_args(a)
    rates = [float(x) for x in a.rates.split(",")] if a.rates else [0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6]
    bad = set(a.configs.split(",")) - set(CPD_CONFIGS)
    if bad:
        raise ValueError(f"--configs: unknown {sorted(bad)}; choose from {list(CPD_CONFIGS)}")
    with ProcessPoolExecutor(a.jobs) as pool:
        futs = {n: pool.submit(_cpd_config, n, rates, a.duration, a.seed, asm)
                for n in a.configs.split(",")}
        res = {n: f.result() for n, f in futs.items()}
    for name, summ in res.items():
        print(f"{name} ({summ['gpus']} GPUs): max QPS/GPU meeting TTFT p90 <= 2 s: {summ['max_rate_meeting_slo']}; "
              + ", ".join(f"{r}: p50 {_f(summ['rates'][str(r)]['all']['ttft_p50_s'])} p90 "
                          f"{_f(summ['rates'][str(r)]['all']['ttft_p90_s'])}" for r in rates), flush=True)
    table = {n: {"max_qps_per_gpu": s["max_rate_meeting_slo"],
                 "achieved_qps_per_gpu": {r: s["runs"][r]["achieved_rps"] / s["gpus"] for r in s["runs"]},
                 "ttft_p50_s": {r: s["rates"][r]["all"]["ttft_p50_s"] for r in s["rates"]},
                 "ttft_p90_s": {r: s["rates"][r]["all"]["ttft_p90_s"] for r in s["rates"]}} for n, s in res.items()}
    for base, cpd in (("2P1D", "CPD-1D"), ("2P2D", "CPD-2D"), ("3R-TP4", "CPD-1D")):
        if base not in table or cpd not in table:
            continue
        b, c = table[base]["max_qps_per_gpu"], table[cpd]["max_qps_per_gpu"]
        table[f"gain_{cpd}_vs_{base}"] = (c / b - 1) if b and c else None
    from warmpath.bench.plots import plot_summaries

    plot_summaries(res, out)
    return {"assumptions": {**asdict(asm), "hardware": "b200", "workload": asm.workload(),
                            "slo": "TTFT p90 <= 2 s, 99% success", "ttft_from": ttft_from(asm.max_concurrency),
                            "steady_s": a.duration}, "blog": BLOG, "table": table}


def ppd_setup(p: int, d: int, mode: str, nic_gbps: float | None = None, handoff: PDHandoff = PDHandoff(),
              overhead_s: float = 0.0) -> SimSetup:
    """The paper's cluster: H100, Llama-3.1-8B, ``p`` prefill and ``d`` decode TP1 workers in
    PPD ``mode``, the NIC at ``nic_gbps`` (default the profile's 400 Gb/s), the dynamic table
    fitted from the roofline (``warmpath map`` too); ``handoff`` and ``overhead_s`` (router/HTTP
    per request) default to warmpath's own."""
    hw, model = HARDWARE["h100"], MODELS["llama-3.1-8b"]
    if nic_gbps is not None:
        hw = replace(hw, nic_bytes_s=nic_gbps / 8 * 1e9)
    table, _ = ppd_table_for(hw, model)
    topo = Topology(f"{p}P{d}D-{mode}", "pd", {"prefill": p, "decode": d}, mode)
    return SimSetup(topo, model, hw, ppd_table=table, admission=AdmissionConfig(256, {"cold": 1024, "warm": 1024}),
                    handoff=handoff, request_overhead_s=overhead_s)


def _ppd_run(p: int, d: int, mode: str, nic_gbps: float | None, rate: float, duration: float, seed: int,
             handoff: PDHandoff = PDHandoff(), overhead_s: float = 0.0) -> dict:
    s = ppd_setup(p, d, mode, nic_gbps, handoff, overhead_s)
    summ = sweep(s, ppd_grid, [rate], duration, {}, s.topology.name, "ppd-grid", 0.0, seed)
    c, run = summ["rates"][str(rate)], summ["runs"][str(rate)]
    return {"turn2_ttft_p50_s": c["turn2+"]["ttft_p50_s"], "turn2_ttft_p90_s": c["turn2+"]["ttft_p90_s"],
            "tpot_s": c["all"]["tpot_s"], "turn2_tpot_s": c["turn2+"]["tpot_s"], "success": c["all"]["success_rate"],
            "ppd_local": run["sim"]["ppd_local"], "ppd_remote": run["sim"]["ppd_remote"]}


def repro_ppd(a: argparse.Namespace, out: Path) -> dict:
    rates = [float(x) for x in a.rates.split(",")] if a.rates else list(PPD_RATES)
    _, sm = ppd_table_for(HARDWARE["h100"], MODELS["llama-3.1-8b"])
    grid = [(split, p, d, mode, r) for r in rates for split, (p, d) in PPD_SPLITS.items()
            for mode in ("x0", "x1", "dynamic")]
    mid = rates[len(rates) // 2]
    bws = [(g, mode) for g in (25, 50, 100, 200, 400) for mode in ("x0", "dynamic")]
    h = PDHandoff.named(a.pd_handoff, a.handoff_extra_ms)
    k = (a.duration, a.seed, h, a.request_overhead_ms / 1e3)
    with ProcessPoolExecutor(a.jobs) as pool:
        f1 = {(sp, m, r): pool.submit(_ppd_run, p, d, m, None, r, *k) for sp, p, d, m, r in grid}
        f2 = {(g, m): pool.submit(_ppd_run, 2, 2, m, g, mid, *k) for g, m in bws}
        res = {f"{r}/{sp}-{m}": f.result() for (sp, m, r), f in f1.items()}
        bw = {k: f.result() for k, f in f2.items()}
    for r in rates:
        for split in PPD_SPLITS:
            x0 = res[f"{r}/{split}-x0"]
            for mode in ("x1", "dynamic"):
                row = res[f"{r}/{split}-{mode}"]
                row["turn2_ttft_change_vs_x0"] = row["turn2_ttft_p50_s"] / x0["turn2_ttft_p50_s"] - 1
                row["tpot_change_vs_x0"] = row["tpot_s"] / x0["tpot_s"] - 1
            print(f"rate {r} {split}: turn-2 TTFT p50 " + ", ".join(
                f"{m} {_f(res[f'{r}/{split}-{m}']['turn2_ttft_p50_s'])}" for m in ("x0", "x1", "dynamic"))
                + f"; TPOT x0 {_f(x0['tpot_s'])} x1 {_f(res[f'{r}/{split}-x1']['tpot_s'])}", flush=True)
    sweep_bw = {g: {"PD": bw[(g, "x0")]["turn2_ttft_p50_s"], "PPD": bw[(g, "dynamic")]["turn2_ttft_p50_s"]}
                for g in (25, 50, 100, 200, 400)}
    for g, row in sweep_bw.items():
        print(f"{g} Gb/s (rate {mid}): turn-2 TTFT p50 PD {_f(row['PD'])} PPD {_f(row['PPD'])}", flush=True)
    return {"assumptions": {"model": "llama-3.1-8b", "hardware": "h100", "workload": "ppd-grid (2 first-turn x 9 "
                            "follow-up settings)", "rates_sessions_s": rates, "steady_s": a.duration,
                            "bandwidth_sweep_rate": mid, "step_model": sm.to_json(), "handoff": asdict(h),
                            "request_overhead_s": a.request_overhead_ms / 1e3},
            "paper": PAPER, "table": res, "bandwidth_sweep_turn2_ttft_p50_s": sweep_bw}


def _f(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def main(a: argparse.Namespace) -> int:
    out = a.out or Path(f"repro_{a.which}")
    out.mkdir(parents=True, exist_ok=True)
    if a.report_only:
        result = json.loads((out / "repro.json").read_text())
    else:
        result = repro_cpd(a, out) if a.which == "cpd" else repro_ppd(a, out)
    seed_report(a.which, result, out)
    (out / "repro.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "compare.md").write_text(markdown(result["seed_vs_ours"]))
    if a.report_only:
        print(markdown(result["seed_vs_ours"]) + f"wrote {out / 'compare.md'}")
        return 0
    if a.which == "cpd":
        for k, v in result["table"].items():
            print(k, v if k.startswith("gain") else f"max QPS/GPU {v['max_qps_per_gpu']}")
    else:
        print(json.dumps(result["table"], indent=1))
    print(markdown(result["seed_vs_ours"]) + f"wrote {out / 'repro.json'}, {out / 'compare.md'} and the figures")
    return 0


def seed_report(which: str, result: dict, out: Path) -> None:
    """``result["seed_vs_ours"]`` and the seed figure from its table (a run, or ``--report-only``
    on ``out/repro.json``)."""
    from warmpath.sim.repro_plot import cpd_figure, ppd_figure

    if which == "cpd":
        result["seed_vs_ours"] = cpd_rows(result["table"])
        cpd_figure(result["table"], out / "cpd_vs_blog.png")
    else:
        sweep, mid = result.get("bandwidth_sweep_turn2_ttft_p50_s"), result["assumptions"].get("bandwidth_sweep_rate")
        result["seed_vs_ours"] = ppd_rows(result["table"], sweep)
        ppd_figure(result["table"], sweep, out / "ppd_vs_paper.png", "" if mid is None else f"2P2D, {mid:g} sessions/s")
