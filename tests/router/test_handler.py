"""The router's own request checks on a real router process with no workers: the prompt's
ids are checked in their compact ``array('I')`` form (``router/handler.py``) before a route
is looked for."""

import httpx

from tests.bad_requests import CHAT, MSG, TEXT, VOCAB
from tests.conftest import serve_process


def test_prompt_ids_are_checked_against_the_vocabulary_before_routing():
    with serve_process("--route-policy", "cpd", command="router") as base:
        def post(path, body):
            return httpx.post(base + path, json={"max_tokens": 2, **body}, timeout=30)

        r = post(TEXT, {"prompt": [1, 2, VOCAB]})                        # the last id is past the vocabulary
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        assert f"token ids must be in [0, {VOCAB})" in r.json()["error"]["message"]
        for body in ({"prompt": [0, 5, VOCAB - 1] * 700}, {"prompt": "Hello"}):   # valid: on to routing
            r = post(TEXT, body)
            assert r.status_code == 503 and r.json()["error"]["message"] == "no worker registered yet"
        r = post(CHAT, {"messages": MSG})
        assert r.status_code == 503 and r.json()["error"]["message"] == "no worker registered yet"
