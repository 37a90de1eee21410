"""The router's load book: queued prompt tokens, running decodes, and what a drain waits for."""

import pytest

from warmpath.router.load import LoadBook
from warmpath.router.views import WorkerView


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
    v = book.views([WorkerView("p", "prefill")])[0]
    assert (v.queued_prefill_tokens, v.running) == (0, 0)
