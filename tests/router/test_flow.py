"""``RequestFlow``'s load book around a decode call: a prompt computed on the decode worker is
booked there until its first token — a streamed one's at its first chunk, a whole answer's at
its predicted first token (its end comes only after the whole decode)."""

import asyncio
from types import SimpleNamespace

import pytest

from warmpath.router.flow import RequestFlow
from warmpath.routing.load import LoadBook
from warmpath.routing.views import Decision, RequestView


class SlowWorker:
    """Answers nothing: after ``after_s`` it notes what the router's book says of ``w`` and fails."""

    def __init__(self, book: LoadBook, after_s: float) -> None:
        self.book, self.after_s, self.seen = book, after_s, None

    async def generate(self, worker, msg):
        await asyncio.sleep(self.after_s)
        x = self.book.of(worker)
        self.seen = (x.prefill_tokens, x.prefilling, x.running)
        raise RuntimeError("worker went away")


def decode_once(predicted_ttft_s: float, stream: bool = False) -> tuple:
    book = LoadBook()
    client = SlowWorker(book, after_s=0.2)
    flow = RequestFlow(SimpleNamespace(load=book, routed={}), client)
    flow._generate_msg = lambda t: None
    d = Decision(None, "w", "local", predicted_ttft_s, 100, "test")
    t = SimpleNamespace(decision=d, prefill=None, rv=SimpleNamespace(num_tokens=400, max_tokens=64, tenant="default", priority=0),
                        body=SimpleNamespace(stream=stream))
    with pytest.raises(RuntimeError, match="went away"):
        asyncio.run(flow._decode(t, None))
    x = book.of("w")
    return client.seen, (x.prefill_tokens, x.prefilling, x.running)


def test_a_whole_answers_prompt_leaves_the_book_at_its_predicted_first_token():
    # 300 tokens computed (400 - 100 cached); first token predicted 0.05 s after sending: 0.2 s
    # in, while it still decodes, the worker no longer counts it as computing (still running)
    assert decode_once(0.05) == ((0, 0, 1), (0, 0, 0))


def test_a_whole_answer_predicted_later_is_still_computing_and_released_once_on_failure():
    assert decode_once(5.0) == ((300, 1, 1), (0, 0, 0))


def test_a_requests_end_hands_its_slot_on_once_even_when_the_books_of_its_answer_fail(caplog):
    """The ledger frees the slot and wakes the waiter first; a malformed worker report that
    breaks the answer's own books (learning, dashboard) is logged and frees nothing twice."""
    from warmpath.routing.admission import Admission, AdmissionConfig
    from warmpath.routing.ledger import RequestLedger
    from warmpath.routing.route import RouteDecider
    from warmpath.routing.policy import ReplicaPolicy
    from warmpath.routing.sessions import SessionTable

    adm = Admission(AdmissionConfig(max_in_flight=1))
    ledger = RequestLedger(RouteDecider(ReplicaPolicy()), adm, SessionTable(), list)
    rv = RequestView(100, (), 16, max_tokens=8)
    assert (ledger.admit("a", rv, Decision(None, "w", "local", 0.1, 0, "t", cls="warm")),
            ledger.admit("b", rv, Decision(None, "w", "local", 0.1, 0, "t", cls="warm"))) == ("run", "queued")
    woken = []

    def broken(t):
        raise ValueError("usage: not a number")

    state = SimpleNamespace(load=LoadBook(), ledger=ledger, wake=woken.extend)
    flow = RequestFlow(state, None)
    flow._learn = broken
    d = Decision(None, "w", "local", 0.1, 0, "test", cls="warm")
    t = SimpleNamespace(decision=d, rv=SimpleNamespace(num_tokens=100, max_tokens=8, tenant="default", priority=0), completion_tokens=8,
                        first_token_at=None, admitted=0.0, finished=lambda metrics: None)
    state.metrics = None
    flow._ended(t, None)
    assert woken == ["b"] and adm.in_flight == 1            # a's slot went to b, exactly once
    assert "the books of a request's end" in caplog.text
