"""Active-active routers' bookkeeping (routing/peers.py, the shared limit in
routing/admission.py, other routers' load in routing/load.py): hand-worked numbers."""

import pytest

from warmpath.routing.admission import Admission, AdmissionConfig
from warmpath.routing.load import LoadBook, WorkerLoad
from warmpath.routing.peers import PeerBook, PeerConfig, PeerReport
from warmpath.routing.views import WorkerView


def report(at, **loads):
    return PeerReport(at, {w: WorkerLoad(*x) for w, x in loads.items()})


def test_peers_alive_by_their_last_report_and_their_loads_added():
    book = PeerBook(PeerConfig(("http://a:1", "http://b:1"), every_s=0.25, alive_s=1.0))
    assert book.routers(0.0) == 1 and book.load_of("w", 0.0) == WorkerLoad()
    book.note("http://a:1", report(10.0, w=(100, 2, 0, 1, 300)))
    book.note("http://b:1", report(10.5, w=(50, 1, 0, 0, 80), v=(7, 0, 0, 1, 0)))
    assert book.alive(11.0) == ["http://a:1", "http://b:1"] and book.routers(11.0) == 3
    assert book.load_of("w", 11.0) == WorkerLoad(150, 3, 0, 1, 380)
    assert book.alive(11.2) == ["http://b:1"] and book.routers(11.2) == 2     # a: 1.2 s silent
    assert book.load_of("w", 11.2) == WorkerLoad(50, 1, 0, 0, 80)            # a's load no longer counts
    assert [(p["url"], p["alive"]) for p in book.to_json(11.2)] == [("http://a:1", False), ("http://b:1", True)]


def test_peer_config_refuses_what_cannot_work():
    with pytest.raises(ValueError, match="http URL"):
        PeerConfig(("a:1",))
    with pytest.raises(ValueError, match="every_s < alive_s"):
        PeerConfig((), every_s=1.0, alive_s=1.0)


def test_the_load_views_add_the_other_routers_load():
    book = LoadBook()
    book.add("w", prefill_tokens=40, running=1, context=100)
    v = book.views([WorkerView("w", "replica")], 0.0, lambda w: WorkerLoad(60, 2, 0, 1, 50))[0]
    assert (v.queued_prefill_tokens, v.running, v.prefilling, v.running_tokens) == (100, 3, 1, 150)
    alone = book.views([WorkerView("w", "replica")], 0.0)[0]
    assert (alone.queued_prefill_tokens, alone.running, alone.running_tokens) == (40, 1, 100)


def test_each_router_admits_its_share_of_the_fleet_limit():
    a = Admission()
    fleet = [WorkerView(f"d{i}", "decode", max_seqs=5) for i in range(3)]   # 15 slots
    a.routers = 2
    a.fit(fleet)
    assert a.limit == 8 and a.current.fleet == 15                             # ceil(15 / 2)
    assert a.current.reason.endswith("d0 5, d1 5, d2 5; this router admits 1/2 of it: 8")
    a.routers = 4
    a.fit(fleet)
    assert a.limit == 4                                                        # ceil(15 / 4)
    fixed = Admission(AdmissionConfig(max_in_flight=10))
    fixed.routers = 3
    fixed.fit(fleet)
    assert fixed.limit == 4 and fixed.current.reason == "fixed by --max-in-flight 10; this router admits 1/3 of it: 4"


def test_a_shrunk_share_holds_new_requests_until_enough_end():
    a = Admission()
    fleet = [WorkerView("d", "decode", max_seqs=4)]
    a.fit(fleet)
    assert [a.offer(i, "warm") for i in range(4)] == ["run"] * 4
    a.routers = 2                      # a second router joined: this one's share is 2
    assert a.fit(fleet) == [] and a.limit == 2
    assert a.offer("x", "warm") == "queued"
    assert a.release() is None and a.release() is None    # 3, then 2 running: still at the share
    assert a.release() == "x"                               # 1 running: x starts


def test_a_session_turn_from_another_router_sets_where_the_next_turn_goes():
    from warmpath.routing.sessions import SessionTable

    t = SessionTable(idle_s=100.0)
    mine = t.touch("s1", 1.0)
    mine.turns = 3
    got = t.adopt("s1", "decode-1", 900, 2, now=5.0)     # an older count of turns does not go back
    assert got is mine and (mine.decode_worker, mine.context_tokens, mine.turns, mine.last_seen) == ("decode-1", 900, 3, 5.0)
    new = t.adopt("s2", "decode-0", 300, 1, now=6.0)    # a session this router never saw
    assert (new.decode_worker, new.context_tokens, new.turns) == ("decode-0", 300, 1) and list(t.sessions) == ["s1", "s2"]
