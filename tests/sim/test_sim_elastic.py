"""Elastic roles in the simulator: the router's rule (``routing/elastic.py``, run by the shared
``RouteDecider``) moves a prefill worker to the decode side while decodes fill the decode
worker's KV — as a replica when most requests go local, else as a decode worker — and back
to prefill once long new documents queue at the prefill tier; no request is lost."""

import random

import pytest

from warmpath.slo import Target
from warmpath.bench.workload import Session, Turn, fast_tokens, tokens
from warmpath.launch.topology import Topology
from warmpath.routing.admission import AdmissionConfig
from warmpath.routing.elastic import ROLES, ElasticConfig
from warmpath.sim.hardware import HARDWARE, MODELS
from warmpath.sim.run import SimSetup, build


def shifting_mix(spacing_s: float) -> list[Session]:
    """0–12 s: short prompts with 512-token answers every ``spacing_s`` (decode-heavy); from
    30 s: a new 32K-token document every 0.1 s with a 4-token answer (prefill-heavy)."""
    rng = random.Random(1)
    a = [Session(f"a{i}", [Turn(tokens(rng, 256), 512)], start=i * spacing_s) for i in range(int(12 / spacing_s))]
    return a + [Session(f"b{i}", [Turn(fast_tokens(rng, 32768), 4)], start=30 + i * 0.1) for i in range(200)]


@pytest.mark.parametrize("spacing_s, lent_as", [(0.06, "decode")])
def test_a_shifting_mix_lends_a_prefill_worker_to_the_decode_side_and_takes_it_back(spacing_s, lent_as):
    setup = SimSetup(Topology("elastic", "goodput", {"prefill": 2, "decode": 1}), MODELS["llama-3.1-8b"],
                     HARDWARE["b200"], kv_blocks=2500, target=Target.parse("warm.ttft_p90=2,cold.ttft_p90=20"),
                     elastic=ElasticConfig(roles=ROLES, hold_s=2.0, cooldown_s=5.0, lent_first=True),
                     admission=AdmissionConfig(1024, {"cold": 4096, "warm": 4096}))
    sim = build(setup)
    recs = sim.run(shifting_mix(spacing_s))
    assert len(recs) == int(12 / spacing_s) + 200 and all(r.ok for r in recs)
    changes = sim.decider.elastic.changes
    # the router learns the step times from the answers (it starts knowing none): the decode
    # worker's remote turns made it lend prefill-0 as a decode worker (which role is lent is
    # the rule's choice by the local share: tests/routing/test_elastic.py)
    assert [(c.worker, c.old, c.new) for c in changes] == [("prefill-0", "prefill", lent_as),
                                                           ("prefill-0", lent_as, "prefill")]
    assert changes[0].reason.startswith("decode pressure ") and changes[0].at < 12
    assert changes[1].reason.startswith("prefill pressure ") and changes[1].at > 30
    assert [(w, r) for _, w, r in sim.stats.role_changes] == [(c.worker, c.new) for c in changes]
    # meanwhile it decoded requests, whose prompts it computed itself (goodput's local path)
    lent = [r for r in recs if r.route["decode"] == "prefill-0"]
    assert len(lent) > 50 and {r.route["path"] for r in lent} == {"local"}
    assert sim.workers["prefill-0"].role == "prefill" and sim.workers["prefill-0"].rules.write_mode == "write-through"
    assert [c.new for _, c in sim.decider.elastic.drained] == [lent_as, "prefill"]
