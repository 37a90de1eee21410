import pytest

from warmpath.routing.admission import Admission, AdmissionConfig
from warmpath.routing.ppd import Cell, Harm, PPDConfig, PPDTable, bucket_of, decide
from warmpath.routing.sessions import SessionTable, session_id
from warmpath.routing.views import RequestView, WorkerView

D = WorkerView("d", "decode", running=2, prefill_tok_s=500.0)


def req(turn=2, n=1000, new=64, out=128):
    return RequestView(num_tokens=n, block_hashes=(), block_size=16, turn=turn, new_tokens=new, max_tokens=out)


def test_buckets():
    assert bucket_of(100, 10, 100, 1) == (0, 0, 0)
    assert bucket_of(1000, 100, 100, 5) == (1, 1, 1)
    assert bucket_of(5000, 1000, 100, 20) == (2, 3, 2)


def test_static_modes_and_turn_one():
    t = PPDTable()
    assert not decide(PPDConfig("x1"), t, req(turn=1), D, 0).local
    assert decide(PPDConfig("x1"), t, req(), D, 0).local
    assert not decide(PPDConfig("x0"), t, req(), D, 0).local


def test_dynamic_score_from_table_and_live_queues():
    key = bucket_of(1000, 64, 128, 2)
    t = PPDTable({key: Cell(ttft_local=0.1, ttft_remote=0.3, tpot_local=0.105, tpot_remote=0.1)})
    d = decide(PPDConfig("dynamic"), t, req(), D, remote_queue_s=0.0)
    assert d.local and d.score == pytest.approx((0.3 - 0.1) / 0.3 - 0.05)
    heavy_tpot = PPDConfig("dynamic", w_ttft=1.0, w_tpot=20.0)
    assert not decide(heavy_tpot, t, req(), D, 0.0).local      # 20 × 5% slowdown > 67% saving
    busy = WorkerView("d", "decode", running=2, queued_prefill_tokens=1000, prefill_tok_s=500.0)
    assert not decide(PPDConfig("dynamic"), t, req(), busy, 0.0).local   # 2 s local queue
    assert PPDTable.from_json(t.to_json()).cells == t.cells


def test_the_tpot_term_counts_every_running_decode_a_local_prefill_stalls():
    """With the online model's TPOTs (``Harm``) and decodes running, the TPOT term is
    ``running`` × each running decode's relative slowdown: local stretches each one's TPOT from
    30 to 40 ms (+33.3%). With none running, this request's own change: local saves it 2 ms of
    32 (−6.25%). A predicted saving to the running decodes is no credit."""
    key = bucket_of(1000, 64, 128, 2)
    t = PPDTable({key: Cell(ttft_local=0.1, ttft_remote=0.4, tpot_local=0.1, tpot_remote=0.1)})
    cfg = PPDConfig("dynamic")
    h = lambda running: Harm(running, own_local=0.030, own_remote=0.032, mates_local=0.040, mates_remote=0.030)
    assert h(2).d_tpot() == pytest.approx(2 / 3)
    two = decide(cfg, t, req(), D, 0.0, harm=h(2))             # dTTFT 0.75 - 0.6667 > 0: local
    assert two.local and two.score == pytest.approx(0.75 - 2 / 3)
    assert "2 running" in two.reason and "table" in two.reason
    three = decide(cfg, t, req(), D, 0.0, harm=h(3))           # 0.75 - 1.0 < 0: remote
    assert not three.local and three.score == pytest.approx(0.75 - 1.0)
    idle = decide(cfg, t, req(), D, 0.0, harm=h(0))            # nobody running: only its own TPOT counts
    assert idle.local and idle.score == pytest.approx(0.75 + 0.0625)
    # the running decodes predicted faster with it local (40 -> 30 ms): no credit, term 0
    assert Harm(2, 0.030, 0.032, 0.030, 0.040).d_tpot() == 0.0
    # without it, the cell's own TPOTs (equal here: no TPOT term)
    assert decide(cfg, t, req(), D, 0.0).score == pytest.approx(0.75)
    assert Harm(1, 0.0, 0.0, 0.0, 0.0).d_tpot() == 0.0


def test_admission_limits_and_warm_first():
    a = Admission(AdmissionConfig(max_in_flight=2, queue_limits={"cold": 1, "warm": 2}))
    assert [a.offer(i, "cold") for i in range(4)] == ["run", "run", "queued", "rejected"]
    assert a.offer("w1", "warm") == "queued" and a.offer("w2", "warm") == "queued"
    assert a.offer("w3", "warm") == "rejected" and a.rejected == 2
    assert a.release() == "w1" and a.release() == "w2" and a.release() == 2
    assert a.cancel("nope") is False
    assert a.release() is None and a.in_flight == 2 - 1
    with pytest.raises(ValueError):
        AdmissionConfig(max_in_flight=0)


def test_sessions():
    assert session_id(None, "abc", None) == "abc"
    assert session_id("u1", None, None) == "user:u1"
    m = [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]
    assert session_id(None, None, m) == session_id(None, None, m + [{"role": "user", "content": "more"}])
    assert session_id(None, None, []) is None
    st = SessionTable(idle_s=10)
    s = st.touch("a", now=0)
    s.decode_worker = "d1"
    assert st.touch("a", now=5).decode_worker == "d1"
    assert st.touch("a", now=20).decode_worker is None      # idle expiry
    st.touch("b", now=20).decode_worker = "d2"
    st.forget_worker("d2")
    assert st.sessions["b"].decode_worker is None
    assert st.expire(now=100) == 2


def test_observed_ttfts_are_queue_free_and_the_live_queues_are_added():
    """The feedback keeps TTFTs without their queue wait; the decision adds each path's live
    queue: local 0.30 s served vs remote 0.20 s, then with a 0.4 s remote queue, then with a
    0.2 s local queue (100 tokens at 500 tok/s) on top."""
    from warmpath.routing.ppd import PPDFeedback

    key = bucket_of(1000, 64, 128, 2)
    fb = PPDFeedback(min_samples=2, explore_every=1000)
    for _ in range(2):
        fb.observe(key, "local", 0.30)
        fb.observe(key, "remote", 0.20)
    fb.seen[key] = 1                  # past the first (exploring) decision
    cfg, t = PPDConfig("dynamic"), PPDTable()
    idle = decide(cfg, t, req(), D, 0.0, fb)
    assert not idle.local and idle.score == pytest.approx(-0.5) and idle.queue_s == 0.0
    assert "observed" in idle.reason
    busy_remote = decide(cfg, t, req(), D, 0.4, fb)                       # 0.30 vs 0.60
    assert busy_remote.local and busy_remote.score == pytest.approx(0.5) and busy_remote.queue_s == 0.0
    both = WorkerView("d", "decode", running=2, queued_prefill_tokens=100, prefill_tok_s=500.0)
    d = decide(cfg, t, req(), both, 0.4, fb)                              # 0.50 vs 0.60
    assert d.local and d.score == pytest.approx(1 / 6) and d.queue_s == pytest.approx(0.2)
    # remote chosen: its decision carries the remote queue (what the outcome's TTFT sheds)
    assert decide(cfg, t, req(), both, 0.1, fb).queue_s == pytest.approx(0.1)   # 0.50 vs 0.30
