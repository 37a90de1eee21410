"""The router's load book: queued prompt tokens, running decodes, and what a drain waits for."""

import pytest

from warmpath.routing.load import LoadBook
from warmpath.routing.views import WorkerView


def test_in_flight_counts_decodes_and_pending_requests_until_they_end():
    book = LoadBook()
    book.add("d", running=1)
    with book.holding("p", "d"), book.computing("p", 300):   # prefill on p, its decode will go to d
        assert (book.in_flight("p"), book.in_flight("d")) == (1, 2)
        assert book.of("p").prefill_tokens == 300
    assert (book.in_flight("p"), book.in_flight("d"), book.of("p").prefill_tokens) == (0, 1, 0)
    with pytest.raises(RuntimeError), book.holding("p"):   # a failed prefill releases too
        raise RuntimeError
    assert book.in_flight("p") == 0
    book.add("d", running=-1)
    assert book.in_flight("d") == 0 and book.in_flight("never-seen") == 0
    v = book.views([WorkerView("p", "prefill")], 0.0)[0]
    assert (v.queued_prefill_tokens, v.running) == (0, 0)


def test_a_handoff_is_bound_for_its_decode_worker_until_its_prefill_returns():
    book = LoadBook()
    with book.bound_for("d", "r1", at=105.0, load_s=0.4), book.bound_for("d", "r2", at=101.5, load_s=0.2):
        with book.bound_for("d", "r3", at=103.0, load_s=0.0):   # nothing to load: its decode still joins d's batch
            assert book.incoming("d", 100.0) == ((1.5, 0.2), (3.0, 0.0), (5.0, 0.4))   # soonest first
        (v,) = book.views([WorkerView("d", "decode")], 104.0)
        assert v.incoming == ((0.0, 0.2), (1.0, 0.4))    # r2 is overdue: any moment now
        with pytest.raises(RuntimeError), book.bound_for("d", "r4", at=110.0, load_s=1.0):
            raise RuntimeError                            # a failed prefill leaves nothing behind
        assert book.incoming("d", 100.0) == ((1.5, 0.2), (5.0, 0.4))
    assert book.incoming("d", 100.0) == () and book.bound == {}
