"""``RequestFlow``'s load book around a decode call: a prompt computed on the decode worker is
booked there until its first token — a streamed one's at its first chunk, a whole answer's at
its predicted first token (its end comes only after the whole decode)."""

import asyncio
from types import SimpleNamespace

import pytest

from warmpath.router.flow import RequestFlow
from warmpath.routing.load import LoadBook
from warmpath.routing.views import Decision


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
    t = SimpleNamespace(decision=d, prefill=None, rv=SimpleNamespace(num_tokens=400, max_tokens=64),
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
