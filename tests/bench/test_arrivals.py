

def test_session_seed_is_one_rule_for_bench_and_sim():
    from warmpath.bench.arrivals import session_seed

    assert (session_seed(7, 0.1), session_seed(7, 0.15), session_seed(0, 2.0)) == (107, 157, 2000)
    assert session_seed(0, 0.57) == 570     # 0.57 * 1000 == 569.99...; int() alone would give 569
