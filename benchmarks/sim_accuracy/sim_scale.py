"""Simulator scale: ~100,000 coding-agent requests on a 64-GPU CPD cluster (B200, Llama-3.1-8B:
4 pre-prefill + 4 prefill instances of TP4, 32 decode GPUs), timed on this machine.

    python -m benchmarks.sim_accuracy.sim_scale [--sessions-per-s 40] [--duration 1470]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from warmpath.slo import CPD_TARGET
from warmpath.bench.workload import coding_agent
from warmpath.launch.topology import Topology
from warmpath.routing.admission import AdmissionConfig
from warmpath.sim.hardware import HARDWARE, MODELS
from warmpath.sim.run import SimSetup, simulate_rate

TOPO = Topology("cpd-64gpu", "cpd", {"pre-prefill": 4, "prefill": 4, "decode": 32})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions-per-s", type=float, default=40.0)
    p.add_argument("--duration", type=float, default=1470.0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/sim_scale.json"))
    a = p.parse_args()
    setup = SimSetup(TOPO, MODELS["llama-3.1-8b"], HARDWARE["b200"], tp={"pre-prefill": 4, "prefill": 4},
                     admission=AdmissionConfig(128, {"cold": 512, "warm": 512}))
    t0 = time.perf_counter()
    res = simulate_rate(setup, lambda n, seed: coding_agent(n, seed), a.sessions_per_s, a.duration, CPD_TARGET)
    wall = time.perf_counter() - t0
    c, sim = res["classes"]["all"], res["sim"]
    out = {"command": " ".join(["python", *sys.argv]), "gpus": setup.gpus, "sessions": res["sessions"],
           "requests": sim["requests"], "completed": c["completed"], "failed": c["failed"],
           "simulated_s": res["duration_s"], "wall_s": wall, "sim_loop_wall_s": sim["wall_s"],
           "events": sim["events"], "events_per_s": sim["events_per_s"],
           "ttft_p50_s": c["ttft_p50_s"], "ttft_p90_s": c["ttft_p90_s"], "tpot_s": c["tpot_s"]}
    a.out.write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
