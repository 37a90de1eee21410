"""Tenants in the simulator: the same fair queue as the router (routing/fair_queue.py). One
tenant floods a replica fleet (30 requests at once) whose admission limit binds; the other sends a few requests.
Under VTC the light tenant's requests wait behind at most about one of the flood's each;
as one tenant (FIFO) they wait behind the whole flood. Priorities go first."""

from warmpath.bench.workload import Session, Turn
from warmpath.launch.topology import resolve
from warmpath.routing.admission import AdmissionConfig
from warmpath.sim.hardware import HARDWARE, MODELS
from warmpath.sim.run import SimSetup, build


def setup():
    return SimSetup(resolve("replica", None, "replica"), MODELS["llama-3.1-8b"], HARDWARE["h100"],
                    admission=AdmissionConfig(max_in_flight=2))


def flood(tenants: bool, light_priority: int = 0) -> dict[str, list[float]]:
    """30 flood requests at t=0, then 4 light ones at t=0.1; TTFT (from arrival) per tenant."""
    out = []
    for i in range(30):
        out.append(Session(f"a{i}", [Turn(list(range(1000 + i * 512, 1000 + i * 512 + 512)), 64, "cold")],
                           start=0.0, tenant="flood" if tenants else "default"))
    for i in range(4):
        out.append(Session(f"b{i}", [Turn(list(range(60000 + i * 512, 60000 + i * 512 + 512)), 64, "cold")],
                           start=0.1, tenant="light" if tenants else "default", priority=light_priority))
    recs = build(setup()).run(out)
    got: dict[str, list[float]] = {"a": [], "b": []}
    for r in recs:
        assert r.ok
        got[r.sid[0]].append(r.ttft)
    return got


def test_the_light_tenant_is_not_queued_behind_the_flood():
    fifo, fair, urgent = flood(False), flood(True), flood(True, light_priority=-1)
    assert max(fair["b"]) < max(fifo["b"]) / 3       # each behind about one flood request, not the whole flood
    assert max(urgent["b"]) <= max(fair["b"])          # a more urgent band goes before the flood
    assert sorted(fair["a"])[-1] >= sorted(fifo["a"])[-1]   # the flood absorbs the wait
