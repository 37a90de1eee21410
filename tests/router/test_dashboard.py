"""The dashboard's memory (router/dashboard.py) on hand-worked trips: per-class percentiles
over the window, per-second rates, bounded rings, role changes, prompt sources."""

import pytest

from warmpath.protocol.openai import CompletionRequest
from warmpath.router.dashboard import Dashboard, prompt_sources
from warmpath.routing.policy import CPDPolicy
from warmpath.router.state import RouterConfig, RouterState
from warmpath.router.trip import Trip
from warmpath.routing.views import Decision, RequestView


@pytest.fixture(scope="module")
def tokenizer():
    from warmpath.models.loader import load_tokenizer

    return load_tokenizer()


@pytest.fixture
def state(tokenizer):
    s = RouterState(CPDPolicy(), tokenizer, "m", RouterConfig())
    s.registry.register("p0", "prefill", "http://p0", now=100.0)
    s.registry.register("d0", "decode", "http://d0", now=100.0)
    return s


def trip(s: RouterState, cls: str, ttft: float, turn: int = 1, tokens: int = 0, usage: dict | None = None,
         ended: float = 0.0) -> Trip:
    """A finished trip: arrived at ``ended - 10``, first token after ``ttft``."""
    d = Decision("p0", "d0", cls, est_ttft_s=0.25, cached_tokens=32, reason=f"{cls} because", cls=cls)
    t = Trip(RequestView(64, (), 16, turn=turn, max_tokens=8), list(range(64)), CompletionRequest(prompt="x", max_tokens=8),
             "text", ended - 10, d, admitted=ended - 10)
    t.first_token_seen(s.metrics, ended - 10 + ttft)
    t.completion_tokens, t.usage = tokens, usage
    return t


PREFILLED = {"prompt_tokens": 64, "completion_tokens": 3,
             "warmpath": {"prefill": {"cached_tokens": 48, "cached_by_tier": {"L1": 16, "L2": 0, "L3": 32}},
                          "decode": {"loaded_tokens": {"L1": 0, "L2": 0, "L3": 64}, "recomputed_tokens": 0}}}
LOCAL = {"prompt_tokens": 40, "warmpath": {"worker": {"loaded_tokens": {"L1": 32, "L2": 0, "L3": 0},
                                                       "recomputed_tokens": 8}}}


def test_prompt_sources_come_from_the_stage_that_computed_the_prompt():
    assert prompt_sources(PREFILLED) == {"L1": 16, "L2": 0, "L3": 32, "computed": 16}
    assert prompt_sources(LOCAL) == {"L1": 32, "L2": 0, "L3": 0, "computed": 8}
    assert prompt_sources({"prompt_tokens": 5, "warmpath": {}}) is None
    assert prompt_sources(None) is None


def test_samples_hold_window_percentiles_per_class_and_rates_per_second(state):
    db = Dashboard(window_s=60)
    for ttft in (1.0, 2.0, 3.0):
        db.trip_ended(trip(state, "cold", ttft, tokens=5, usage=PREFILLED, ended=1000.0), now=1000.0)
    db.trip_ended(trip(state, "warm", 0.5, turn=2, tokens=1, usage=LOCAL, ended=1010.0), now=1010.0)
    state.admission.rejected = 4
    state.metrics.kv_bytes.inc(3000)
    first = db.sample(state, now=1010.0, wall=5.0)
    assert first["classes"]["cold"] == {"ttft_p50": 2.0, "ttft_p90": pytest.approx(2.8), "tpot_p50": 2.0, "n": 3}
    assert first["classes"]["warm"] == {"ttft_p50": 0.5, "ttft_p90": 0.5, "tpot_p50": None, "n": 1}
    assert first["classes"]["turn2+"]["ttft_p50"] == 0.5
    assert first["rejected_s"] == 4 and first["kv_bytes_s"] == 3000
    assert first["sources_s"] == {"L1": 3 * 16 + 32, "L2": 0, "L3": 3 * 32, "computed": 3 * 16 + 8}
    state.admission.rejected = 10
    second = db.sample(state, now=1012.0, wall=7.0)        # 2 s later: rates per second
    assert second["rejected_s"] == 3 and second["kv_bytes_s"] == 0 and second["sources_s"]["L1"] == 0
    later = db.sample(state, now=1065.0, wall=60.0)         # the cold trips left the 60 s window
    assert later["classes"]["cold"]["n"] == 0 and later["classes"]["cold"]["ttft_p50"] is None
    assert later["classes"]["warm"]["n"] == 1


def test_rings_are_bounded_and_decisions_come_newest_first(state):
    db = Dashboard(history_s=3, decisions_kept=2)
    for i in range(5):
        db.trip_ended(trip(state, "cold", 1.0 + i, ended=100.0 + i), now=100.0 + i)
        db.sample(state, now=100.0 + i, wall=float(i))
    out = db.state(state, now=101.0)
    assert [x["t"] for x in out["samples"]] == [2.0, 3.0, 4.0]
    assert [d["ttft_s"] for d in out["decisions"]] == [5.0, 4.0]
    d = out["decisions"][0]
    assert (d["path"], d["prefill"], d["decode"], d["reason"], d["est_ttft_s"]) == ("cold", "p0", "d0",
                                                                                    "cold because", 0.25)
    assert out["workers"] == {"p0": {"role": "prefill", "last_seen_s": 1.0, "health": "ok"},
                              "d0": {"role": "decode", "last_seen_s": 1.0, "health": "ok"}}
    assert db.state(state, now=121.0)["workers"]["p0"]["health"] == "late"   # 2 heartbeats missed


def test_a_role_that_changes_between_samples_is_logged(state):
    db = Dashboard()
    db.sample(state, now=1.0, wall=1.0)
    state.registry.register("d0", "prefill", "http://d0", now=101.0)      # d0 comes back as prefill
    state.registry.register("r9", "replica", "http://r9", now=101.0)      # new: not a change
    db.sample(state, now=2.0, wall=2.0)
    db.sample(state, now=3.0, wall=3.0)
    assert db.state(state)["role_changes"] == [{"t": 2.0, "worker": "d0", "from": "decode", "to": "prefill"}]
    assert db.roles == {"p0": "prefill", "d0": "prefill", "r9": "replica"}


def test_a_role_change_the_router_made_is_logged_once_with_its_reason(state):
    db = Dashboard()
    db.sample(state, now=1.0, wall=1.0)
    state.registry.set_role("d0", "replica")                              # elastic roles moved it
    db.note_change("d0", "decode", "replica", "decode pressure 1.10 vs prefill 0.00", wall=1.5)
    db.sample(state, now=2.0, wall=2.0)                                    # the sample sees no other change
    assert db.state(state)["role_changes"] == [{"t": 1.5, "worker": "d0", "from": "decode", "to": "replica",
                                                "reason": "decode pressure 1.10 vs prefill 0.00"}]
