"""The router's P→D hand-off per engine (router/handoff.py) on hand-made prefill replies: the
decode worker's message, where TTFT is taken, the replies refused, the pairs refused."""

import orjson
import pytest

from warmpath.protocol.internal import GenerateRequest, PrefillReply, PrefillStage, TierTokens
from warmpath.protocol.openai import CompletionRequest
from warmpath.router.dispatch import UpstreamError
from warmpath.router.flow import RequestFlow
from warmpath.router.handoff import HANDOFFS, ConnectorHandoff, L3Handoff, handoff_for
from warmpath.router.metrics import RouterMetrics
from warmpath.router.trip import Trip
from warmpath.routing.views import Decision, RequestView

PARAMS = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[4, 5]],
          "remote_engine_id": "e-1", "remote_request_id": "cmpl-1-0", "remote_host": "127.0.0.1", "remote_port": 5601}


def reply(**kw) -> PrefillReply:
    base = dict(token=7042, prompt_tokens=64, cached_tokens=32, queue_s=0.5, prefill_s=1.0, kv_blocks=4,
                kv_bytes=4096, l3_get_s=0.0, l3_put_s=0.125, cached_by_tier=TierTokens(L1=32))
    return PrefillReply(**{**base, **kw})


def trip() -> Trip:
    d = Decision("p0", "d0", "warm", est_ttft_s=0.25, cached_tokens=32, reason="test", cls="warm")
    return Trip(RequestView(64, (), 16, max_tokens=8), list(range(64)), CompletionRequest(prompt="x", max_tokens=8, temperature=0.0),
                "text", 100.0, d, admitted=100.0)


def test_handoffs_by_engine():
    assert isinstance(handoff_for("vllm", "vllm"), ConnectorHandoff)
    assert isinstance(handoff_for("warmpath", "warmpath"), L3Handoff)
    assert sorted(HANDOFFS) == ["vllm", "warmpath"]
    for p, d in (("warmpath", "vllm"), ("vllm", "warmpath"), ("sglang", "sglang")):
        with pytest.raises(UpstreamError) as e:
            handoff_for(p, d)
        assert e.value.status == 500
        assert orjson.loads(e.value.content)["error"]["message"] == (
            f"no hand-off from a {p} prefill worker to a {d} decode worker")


def test_vllm_handoff_passes_the_params_and_leaves_the_first_token_to_the_decode_worker():
    t, m = trip(), RouterMetrics()
    t.prefilled(m, reply(kv_transfer_params=PARAMS, kv_blocks=0, kv_bytes=0, queue_s=0.0), 101.0,
                handoff_for("vllm", "vllm"))
    assert (t.first_token, t.ttft_s) == (None, None)            # TTFT: the decode worker's first token
    stage = PrefillStage(cached_tokens=32, cached_by_tier=TierTokens(L1=32), kv_bytes=0, kv_blocks=0)
    assert RequestFlow(None, None)._generate_msg(t) == GenerateRequest(
        kind="text", prompt_token_ids=list(range(64)), request=t.body.forwarded(), prefill=stage,
        kv_transfer_params=PARAMS)
    t.first_token_seen(m, 103.0)
    assert t.ttft_s == 3.0


def test_warmpath_handoff_passes_the_first_token():
    t, m = trip(), RouterMetrics()
    t.prefilled(m, reply(), 101.0, handoff_for("warmpath", "warmpath"))
    assert t.first_token == 7042 and t.ttft_s is not None and t.queue_s == 0.5
    msg = RequestFlow(None, None)._generate_msg(t)
    assert (msg.first_token, msg.kv_transfer_params, msg.prefill) == (
        7042, None, PrefillStage(cached_tokens=32, cached_by_tier=TierTokens(L1=32), kv_bytes=4096, kv_blocks=4))


def test_replies_that_cannot_be_handed_off_are_502s():
    with pytest.raises(UpstreamError) as e:
        ConnectorHandoff().check(reply(), "p0")
    assert e.value.status == 502 and b"no kv_transfer_params from a vLLM prefill worker" in e.value.content
    with pytest.raises(UpstreamError) as e:
        L3Handoff().check(reply(kv_transfer_params=PARAMS), "p0")
    assert e.value.status == 502 and b"worker p0" in e.value.content
    ConnectorHandoff().check(reply(kv_transfer_params=PARAMS), "p0")
    L3Handoff().check(reply(), "p0")
