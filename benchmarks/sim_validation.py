"""Simulator vs the real cluster on this machine: same workload, topology, rates and seeds.

Reads the real runs of ``benchmarks/cluster.py`` (``benchmarks/results/cluster``) and its
``calibration.json`` (``warmpath calibrate --threads 1``: the workers run one thread each),
simulates every rate point the real cluster served within its SLO (below saturation) with
the CPU profile (fitted step times, 2 shared cores, 0.5 GiB L1 + 0.5 GiB L2 per worker),
and reports the absolute error of TTFT p50 and TPOT per point and their medians.

    python benchmarks/sim_validation.py [--results benchmarks/results/cluster]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import cluster as real  # noqa: E402  (benchmarks/cluster.py: the same workload definitions)

from warmpath.bench.arrivals import ArrivalConfig, arrival_times  # noqa: E402
from warmpath.bench.metrics import summarize  # noqa: E402
from warmpath.bench.workload import Session, Turn, repo_contexts  # noqa: E402
from warmpath.cluster.topology import resolve  # noqa: E402
from warmpath.engine.scheduler import SchedulerConfig  # noqa: E402
from warmpath.engine.step_model import StepModel  # noqa: E402
from warmpath.sim.cli import CPU  # noqa: E402
from warmpath.sim.profiles import MODELS  # noqa: E402
from warmpath.sim.run import SimSetup, build  # noqa: E402

GIB = 1 << 30


def simulate(topology: str, rate: float, duration: float, fitted: StepModel, hw=CPU) -> dict:
    m = MODELS["smollm2-135m"]
    block_bytes = 16 * m.kv_bytes_per_token
    setup = SimSetup(resolve(topology), m, hw, fitted=fitted, kv_blocks=int(0.5 * GIB // block_bytes),
                     l2_gib=0.5, scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=512,
                                                           max_model_len=8192), cpu_cores=2)
    sim = build(setup)
    # the real run primed the repository contexts one after another before measuring
    primes = [Session(f"prime-{i}", [Turn(ctx[-1:] + [1000, 1001], 1)], prefix=ctx[:-1], start=-60.0 + 20 * i)
              for i, ctx in enumerate(repo_contexts(real.SEED, real.AGENT["repos"], real.AGENT["context"]))]
    times = arrival_times(ArrivalConfig(rate, duration, seed=real.SEED))
    sessions = real.agent(len(times), real.SEED + int(rate * 1000))
    for s, t in zip(sessions, times):
        s.start = t
    recs = [r for r in sim.run(primes + sessions) if not r.sid.startswith("prime-")]
    return summarize(recs, max(sim.now, duration), {})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=Path("benchmarks/results/cluster"))
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/sim_validation.json"))
    p.add_argument("--duration", type=float, default=90.0, help="the real run's --duration")
    p.add_argument("--l3-gbps", type=float, default=None,
                   help="L3 bandwidth of the CPU profile in GB/s (default: its 1.0, measured alone)")
    a = p.parse_args()
    cal = json.loads((a.results / "calibration.json").read_text())
    fitted = StepModel.from_json(cal["step_model"])
    hw = replace(CPU, nic_bytes_s=a.l3_gbps * 1e9) if a.l3_gbps else CPU
    rows, err_ttft, err_tpot = [], [], []
    for topo in ("cpd-1d", "pd-2p1d"):
        summ = json.loads((a.results / topo / "summary.json").read_text())
        for r, run in summ["runs"].items():
            if not run["meets_slo"]:
                continue   # saturated: queueing dominates and small errors explode
            meas = summ["rates"][r]["all"]
            pred = simulate(topo, float(r), a.duration, fitted, hw)["all"]
            et = abs(pred["ttft_p50_s"] - meas["ttft_p50_s"]) / meas["ttft_p50_s"]
            ep = abs(pred["tpot_s"] - meas["tpot_s"]) / meas["tpot_s"]
            err_ttft.append(et)
            err_tpot.append(ep)
            rows.append({"topology": topo, "rate": float(r),
                         "ttft_p50_s": {"measured": meas["ttft_p50_s"], "simulated": pred["ttft_p50_s"], "abs_err": et},
                         "tpot_s": {"measured": meas["tpot_s"], "simulated": pred["tpot_s"], "abs_err": ep},
                         "ttft_p90_s": {"measured": meas["ttft_p90_s"], "simulated": pred["ttft_p90_s"]}})
            print(f"{topo} rate {r}: TTFT p50 measured {meas['ttft_p50_s']:.3f} simulated {pred['ttft_p50_s']:.3f} "
                  f"({et:.0%}) | TPOT measured {meas['tpot_s']:.3f} simulated {pred['tpot_s']:.3f} ({ep:.0%})")
    out = {"command": " ".join(["python", *sys.argv]), "l3_bytes_s": hw.nic_bytes_s, "points": rows,
           "median_abs_err": {"ttft_p50": statistics.median(err_ttft) if err_ttft else None,
                              "tpot": statistics.median(err_tpot) if err_tpot else None}}
    a.out.write_text(json.dumps(out, indent=1))
    print(f"median absolute error: TTFT p50 {out['median_abs_err']['ttft_p50']}, TPOT {out['median_abs_err']['tpot']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
