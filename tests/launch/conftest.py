"""Fixtures of the tests that start whole clusters: the greedy answers one engine gives for
the requests they send, computed once for every module that compares against them."""

import pytest

from tests.conftest import served_params

M = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TEXT = "The three tiers of a KV cache hierarchy are"
TURNS = ["Tell me about the history of Rome in two sentences.", "And then?", "Why?"]


@pytest.fixture(scope="session")
def reference(served_model):
    """Greedy answers of a single engine (with the workers' other defaults: SmolLM2's
    repetition penalty): the question, the text prompt, a 3-turn chat."""
    from warmpath.engine.llm_engine import EngineConfig, LLMEngine

    e = LLMEngine(EngineConfig(), loaded=served_model)
    tok = e.tokenizer

    def run(ids, n):
        return tok.decode(e.generate([ids], served_params(served_model, n, temperature=0))[0],
                          skip_special=True)

    ref = {"chat": run(tok.encode(tok.apply_chat_template(QUESTION), add_special=False), 16),
           "text": run(tok.encode(TEXT), 12), "turns": []}
    msgs = []
    for q in TURNS:
        msgs.append({"role": "user", "content": q})
        a = run(tok.encode(tok.apply_chat_template(msgs), add_special=False), 20)
        ref["turns"].append(a)
        msgs.append({"role": "assistant", "content": a})
    return ref
