"""The simulator side of ``benchmarks/tenants/fairness.py``: two H100 replicas of Llama-3.1-8B
(vLLM's engine defaults), the router's admission sized to the fleet, its wait queues made
large enough to hold the whole backlog (so what is measured is the order, not 429s)."""

from __future__ import annotations

from warmpath.bench.workload import Session, Turn
from warmpath.launch.topology import resolve
from warmpath.routing.admission import AdmissionConfig
from warmpath.sim.hardware import HARDWARE, MODELS
from warmpath.sim.run import SimSetup, build

QUEUES = {"cold": 10**6, "warm": 10**6}


class Runner:
    def __init__(self, a) -> None:
        self.a = a

    def describe(self) -> str:
        return "simulated: 2 x H100, Llama-3.1-8B, vLLM defaults, replica policy, router queues unbounded"

    def setup(self) -> SimSetup:
        return SimSetup(resolve("replica-2", None, "replica"), MODELS["llama-3.1-8b"], HARDWARE["h100"],
                        admission=AdmissionConfig(queue_limits=QUEUES))

    def capacity(self, seed: int) -> float:
        """Requests/s the fleet completes under a flood of 2,000 requests at once."""
        n = 2000
        sim = build(self.setup())
        recs = sim.run([Session(f"cap-{i}", [Turn([1000 + (i * 7919 + j) % 39000 for j in range(self.a.prompt)],
                                                  self.a.answer, "cold")]) for i in range(n)])
        return sum(1 for r in recs if r.ok) / sim.last_end

    def run(self, sessions: list[Session]):
        """The records, and: the largest VTC counter gap between tenants both waiting (fairness
        runs), or the workers' preemptions per priority (priority runs)."""
        sim = build(self.setup())
        q = sim.admission.queue
        gap = {"max": 0.0, "max_cost": 0.0}
        pop = q.pop

        def watched():
            w = pop()
            if w is not None:
                gap["max_cost"] = max(gap["max_cost"], w.cost)
                waiting = [t for t, n in q.by_tenant.items() if n]
                if len(waiting) > 1:
                    cs = [q.vtc.counters.get(t, 0.0) for t in waiting]
                    gap["max"] = max(gap["max"], max(cs) - min(cs))
            return w
        q.pop = watched
        recs = sim.run(sessions)
        pre: dict[int, int] = {}
        for w in sim.workers.values():
            for p, n in w.sched.preempted_by_priority.items():
                pre[p] = pre.get(p, 0) + n
        if any(s.tenant != "default" for s in sessions):
            return recs, {"max_counter_gap": round(gap["max"], 1), "bound_2x_max_cost": round(2 * gap["max_cost"], 1)}
        return recs, {str(p): n for p, n in sorted(pre.items())}

    def close(self) -> None:
        pass
