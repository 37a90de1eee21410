import random

from warmpath.engine.block_manager import BlockManager
from warmpath.engine.scheduler import Scheduler, SchedulerConfig
from warmpath.kv.block_pool import BlockPool

from tests.engine.helpers import make_seq


def make(blocks=64, **kw):
    pool = BlockPool(blocks)
    return pool, Scheduler(SchedulerConfig(**kw), BlockManager(pool, 4))


def run_step(s, token=7):
    out = s.schedule()
    sampled = {x.seq.request_id: token for x in out.scheduled if x.samples}
    return out, s.update(out, sampled, eos_ids=(0,))


def test_chunked_prefill_respects_budget():
    pool, s = make(max_num_batched_tokens=8)
    a = make_seq("a", 20, start=100)
    s.add(a)
    sizes = []
    for _ in range(3):
        out, _ = run_step(s)
        sizes.append([(x.seq.request_id, x.num_tokens) for x in out.scheduled])
    assert sizes == [[("a", 8)], [("a", 8)], [("a", 4)]]
    assert a.output_token_ids == [7] and a.num_computed_tokens == 20


def test_decodes_not_starved_by_long_prefill():
    pool, s = make(max_num_batched_tokens=8)
    a = make_seq("a", 4, start=100)
    s.add(a)
    run_step(s)  # a prefilled, first token out
    s.add(make_seq("b", 40, start=200))
    for _ in range(4):
        out, _ = run_step(s)
        got = {x.seq.request_id: x.num_tokens for x in out.scheduled}
        assert got == {"a": 1, "b": 7}


def test_no_chunking_runs_long_prompt_alone():
    pool, s = make(max_num_batched_tokens=8, enable_chunked_prefill=False)
    s.add(make_seq("a", 20, start=100))
    s.add(make_seq("b", 3, start=300))
    out, _ = run_step(s)
    assert [(x.seq.request_id, x.num_tokens) for x in out.scheduled] == [("a", 20)]
    out, _ = run_step(s)
    assert [(x.seq.request_id, x.num_tokens) for x in out.scheduled] == [("a", 1), ("b", 3)]


def test_preemption_by_recompute_when_blocks_run_out():
    pool, s = make(blocks=4, max_num_batched_tokens=64)
    a = make_seq("a", 8, start=100, max_tokens=20)
    b = make_seq("b", 8, start=200, max_tokens=20)
    s.add(a)
    s.add(b)
    run_step(s)  # both prefill: 2 blocks each, pool full
    assert pool.num_free == 0
    out, _ = run_step(s)  # both need a 3rd block -> b (newest) preempted
    assert out.preempted == [b] and b.num_computed_tokens == 0 and b.block_ids == []
    assert [x.seq.request_id for x in out.scheduled] == ["a"]
    assert s.waiting[0] is b and b.output_token_ids == [7]
    pool.check_integrity()


def test_finish_reasons_and_abort_free_blocks():
    pool, s = make(max_num_batched_tokens=64)
    a = make_seq("a", 5, start=100, max_tokens=2)
    s.add(a)
    run_step(s)
    _, fin = run_step(s)
    assert fin == [a] and a.finish_reason == "length" and pool.num_free == 64
    b = make_seq("b", 5, start=100, max_tokens=9)
    s.add(b)
    _, fin = run_step(s, token=0)  # eos
    assert fin == [b] and b.finish_reason == "stop"
    c = make_seq("c", 30, start=500)
    s.add(c)
    run_step(s)
    s.finish(c, "abort")
    assert pool.num_free == 64 and not s.has_work()
    pool.check_integrity()


def test_max_num_seqs():
    pool, s = make(max_num_seqs=2)
    for i in range(3):
        s.add(make_seq(f"r{i}", 3, start=10 * i))
    out, _ = run_step(s)
    assert [x.seq.request_id for x in out.scheduled] == ["r0", "r1"]


def test_prefix_stats():
    pool, s = make()
    s.add(make_seq("a", 9))
    run_step(s)
    s.add(make_seq("b", 9))
    run_step(s)
    assert (s.prefix_query_tokens, s.prefix_hit_tokens) == (18, 8)


def test_random_requests_and_aborts_leak_nothing():
    rng = random.Random(0)
    pool, s = make(blocks=24, max_num_batched_tokens=16, max_num_seqs=6)
    live = []
    for i in range(300):
        if rng.random() < 0.3:
            q = make_seq(f"r{i}", rng.randint(1, 30), start=rng.choice([0, 1000, 2000]),
                         max_tokens=rng.randint(1, 12))
            s.add(q)
            live.append(q)
        if live and rng.random() < 0.1:
            s.finish(live.pop(rng.randrange(len(live))), "abort")
        run_step(s, token=rng.randint(1, 50))
        pool.check_integrity()
    while s.has_work():
        run_step(s, token=5)
    assert pool.num_free == 24
    pool.check_integrity()


def test_waiting_sequences_go_by_priority_then_arrival():
    pool, s = make(max_num_batched_tokens=64, max_num_seqs=1)
    for rid, prio in (("a", 0), ("b", 5), ("c", -1), ("d", 0), ("e", 5)):
        s.add(make_seq(rid, 4, start=100, priority=prio))
    assert [q.request_id for q in s.waiting] == ["c", "a", "d", "b", "e"]
    out, _ = run_step(s)
    assert [x.seq.request_id for x in out.scheduled] == ["c"]


def test_preemption_takes_the_least_urgent_and_never_a_more_urgent_one():
    pool, s = make(blocks=6, max_num_batched_tokens=64)
    hi = make_seq("hi", 8, start=100, max_tokens=20, priority=-1)
    lo = make_seq("lo", 8, start=200, max_tokens=20, priority=3)
    mid = make_seq("mid", 8, start=300, max_tokens=20, priority=0)
    for q in (hi, lo, mid):      # lo is admitted before mid: without priorities mid (the newest) would go
        s.add(q)
    assert [q.request_id for q in s.waiting] == ["hi", "mid", "lo"]
    run_step(s)                  # all three prefill: 2 blocks each, the pool full
    assert pool.num_free == 0
    out, _ = run_step(s)         # each needs a 3rd block: lo goes (least urgent), its blocks serve hi and mid
    assert out.preempted == [lo] and {x.seq.request_id for x in out.scheduled} == {"hi", "mid"}
    assert s.waiting[0] is lo
    # a lone more urgent sequence is never preempted for a less urgent one: lo waits
    pool2, s2 = make(blocks=4, max_num_batched_tokens=64)
    a, b = make_seq("a", 8, start=100, max_tokens=20, priority=-2), make_seq("b", 8, start=200, max_tokens=20, priority=4)
    s2.add(a)
    s2.add(b)
    run_step(s2)
    out, _ = run_step(s2)        # both need a block: b (less urgent) goes, never a
    assert out.preempted == [b] and [x.seq.request_id for x in out.scheduled] == ["a"]
    pool.check_integrity()


def test_an_urgent_waiting_sequence_preempts_a_less_urgent_running_one_under_kv_pressure():
    pool, s = make(blocks=4, max_num_batched_tokens=64)
    bulk = [make_seq(f"b{i}", 7, start=100 * (i + 1), max_tokens=20, priority=2) for i in range(2)]
    for q in bulk:
        s.add(q)
    run_step(s)                        # both bulk prefill 7 tokens: 2 blocks each, the pool full
    assert pool.num_free == 0
    urgent = make_seq("u", 8, start=900, max_tokens=4, priority=0)
    s.add(urgent)
    out = s.schedule()                 # the bulk decodes fit their 2nd block; the urgent one needs 2 more
    assert urgent in [x.seq for x in out.scheduled]      # it got in: the latest bulk one made room
    assert out.preempted == [bulk[1]] and s.waiting[0] is bulk[1]
    # an equally urgent waiting sequence preempts nobody: it waits
    pool2, s2 = make(blocks=4, max_num_batched_tokens=64)
    for q in (make_seq("x", 7, start=100, max_tokens=20), make_seq("y", 7, start=200, max_tokens=20)):
        s2.add(q)
    run_step(s2)
    s2.add(make_seq("z", 8, start=300, max_tokens=4))
    out2 = s2.schedule()
    assert [x.seq.request_id for x in out2.scheduled] == ["x", "y"] and out2.preempted == []
    pool.check_integrity()
