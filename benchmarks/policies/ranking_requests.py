"""The ranking's requests side by side, real against simulated (issue 28's diagnosis): per
request its send time, class, path, TTFT and TPOT on each side, and on the real side the prefill
worker's queue and its own seconds (``Server-Timing``).

A session's next turn is sent when its answer ends, so the send times are rebuilt from the
session's start (the arrival seed's) and the earlier turns' end-to-end times, on both sides. The
simulated requests are one run of ``ranking_sim``'s (scatter seed ``--scatter``), through the
sweep's earlier rates as the sweep runs them; ``--write DIR`` keeps them as
``DIR/<arm>_s<seed>/requests.jsonl`` (the real part's row format).

    python -m benchmarks.policies.ranking_requests --arm pd-1p1d --seed 12 --rate 0.05
        [--sim-decode served|calibrated] [--write benchmarks/results/ranking/sim]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from benchmarks.common.results import read_json, read_jsonl
from benchmarks.common.workload import agent
from benchmarks.policies.ranking import ARMS, joint_target
from benchmarks.policies.ranking_sim import cpu_setup, served_decode_factor
from benchmarks.sim_accuracy.sim_validation import simulate_sweep
from warmpath.bench.arrivals import ArrivalConfig, arrival_times, session_seed
from warmpath.bench.requests_log import request_row

RANKING = Path("benchmarks/results/ranking")


def session_starts(seed: int, rate: float, duration: float) -> dict[str, float]:
    """Each session's start at ``rate`` (``run_rate``'s arrivals and sessions for ``seed``)."""
    times = arrival_times(ArrivalConfig(rate, duration, seed=seed))
    return {s.sid: t for s, t in zip(agent(len(times), session_seed(seed, rate)), times)}


def sends(rows: list[dict], starts: dict[str, float]) -> list[tuple[float, int, dict]]:
    """``(send time, turn of its session, row)`` per row, by send time: a session's rows in the
    order they ended, the first sent at the session's start, each next one when the previous
    one's answer ended (its send + ``e2e_s``); a failed turn ends its session."""
    by = defaultdict(list)
    for r in rows:
        by[r["sid"]].append(r)
    out = []
    for sid, rs in by.items():
        t = starts[sid]
        for i, r in enumerate(rs):
            out.append((t, i + 1, r))
            t += r["e2e_s"] or 0.0
    return sorted(out, key=lambda x: (x[0], x[2]["sid"]))


def sim_rows(arm: str, seed: int, rates: list[float], duration: float, calibration: Path, decode_factor: float,
             unloaded: float, scatter: int = 0, timeout: float = 120.0) -> dict[float, list[dict]]:
    """One simulated sweep of ``arm`` at arrival ``seed``: per rate its ``requests.jsonl`` rows
    (attained: under the joint target of ``unloaded``, the unloaded TPOT)."""
    setup = replace(cpu_setup(calibration, timeout, decode_factor), topology=ARMS[arm], seed=scatter)
    target = joint_target(unloaded)
    if ARMS[arm].policy == "goodput":
        setup = replace(setup, target=target)
    return simulate_sweep(setup, rates, duration, seed,
                          lambda recs, _d, rate: [request_row(r, rate, target.attains(r)) for r in recs])


def cells(send: float, row: dict) -> str:
    """A row's columns: send time, class, path, the prefill worker's queue and own seconds
    (real side only), TTFT, TPOT."""
    t, f = row.get("server_timing") or {}, lambda x, d=2: "-" if x is None else f"{x:.{d}f}"
    path = f"{row.get('prefill') or ''}>{row.get('decode') or '-'}{'/' + row['ppd'] if row.get('ppd') else ''}"
    return (f"{send:7.2f} {row['class']:4s} {path:24s} q {f(t.get('prefill_queue')):>5s} "
            f"p {f(t.get('prefill_worker')):>5s} ttft {f(row['ttft_s']):>6s} tpot {f(row['tpot_s'], 3)}")


def side_by_side(real: list[dict], sim: list[dict], starts: dict[str, float]) -> list[str]:
    """One line per request, real then simulated, keyed by session and turn, by real send time."""
    got = {(r["sid"], n): (t, r) for t, n, r in sends(sim, starts)}
    lines = []
    for t, n, r in sends(real, starts):
        s = got.pop((r["sid"], n), None)
        lines.append(f"{r['sid']:8s} t{n} | {cells(t, r)} | {cells(*s) if s else '(not simulated)'}")
    lines += [f"{k[0]:8s} t{k[1]} | {'(not in the real run)':70s} | {cells(*v)}" for k, v in sorted(got.items())]
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arm", default="pd-1p1d", help=f"of {sorted(ARMS)}")
    p.add_argument("--seed", type=int, default=12)
    p.add_argument("--rate", type=float, default=0.05)
    p.add_argument("--scatter", type=int, default=0, help="the simulated run's step-scatter seed")
    p.add_argument("--sim-decode", choices=("served", "calibrated"), default="served")
    p.add_argument("--calibration", type=Path, default=Path("benchmarks/results/sim_accuracy/calibration_refit.json"))
    p.add_argument("--write", type=Path, help="write every arm and seed's simulated requests.jsonl under this folder")
    a = p.parse_args()
    if a.arm not in ARMS:
        p.error(f"--arm: unknown {a.arm!r}; known: {sorted(ARMS)}")
    result = read_json(RANKING / "ranking.json")
    cal, rates, dur, timeout, unloaded = (a.calibration, result["rates"], result["duration_s"], result["timeout_s"],
                                          result["unloaded_tpot_s"])
    if a.rate not in rates:
        p.error(f"--rate: the ranking ran {rates}")
    factor = 1.0 if a.sim_decode == "calibrated" else served_decode_factor(
        unloaded, cpu_setup(cal, timeout), ARMS["replica-2"], 10, 20.0)
    if a.write:
        for key in result["real"]:
            arm, seed = key.split("/")
            rows = sim_rows(arm, int(seed), rates, dur, cal, factor, unloaded, a.scatter, timeout)
            out = a.write / f"{arm}_s{seed}"
            out.mkdir(parents=True, exist_ok=True)
            (out / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for rs in rows.values() for r in rs))
    real = read_jsonl(RANKING / "real" / f"{a.arm}_s{a.seed}" / "requests.jsonl")
    real = [r for r in real if r["rate"] == a.rate]
    sim = sim_rows(a.arm, a.seed, [r for r in rates if r <= a.rate], dur, cal, factor, unloaded, a.scatter, timeout)
    print(f"{a.arm} seed {a.seed} at {a.rate} sessions/s; simulated decodes x{factor:.3f}, scatter seed {a.scatter}")
    print(f"request     | real: send, class, path, prefill queue / worker s, TTFT, TPOT{'':22s} | simulated")
    print("\n".join(side_by_side(real, sim[a.rate], session_starts(a.seed, a.rate, dur))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
