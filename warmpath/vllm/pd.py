"""vLLM's documented disaggregated protocol, as a vLLM worker speaks it (pure).

The hand-off of one request (vLLM's ``examples/online_serving/disaggregated_serving`` proxy
does the same between its two servers):

1. the prefill worker sends the request to its vLLM server with ``max_tokens: 1``, not
   streamed, and ``kv_transfer_params`` asking for a remote decode (:func:`prefill_body`); vLLM
   computes the prompt, keeps its blocks for the decode side to pull, and answers with the
   ``kv_transfer_params`` that locate them (engine id, block ids, side-channel host and port);
2. the router passes those on (``PrefillReply`` → ``GenerateRequest.kv_transfer_params``);
3. the decode worker sends the whole original request to its vLLM server with them
   (:func:`decode_body`): vLLM pulls the prompt's KV through its connector and generates
   every token, the first one included (the prefill's token is not reused: it may differ
   when sampling).
"""

from __future__ import annotations

from warmpath.protocol.errors import APIError
from warmpath.protocol.internal import PrefillReply, TierTokens

# what the prefill request asks of vLLM's connector: keep the KV for a remote decode
REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}


def prefill_body(body: dict) -> dict:
    """The prefill server's ``/v1/completions`` body from the request's (``relay.completion_body``):
    one token, one JSON answer (``kv_transfer_params`` come only in a non-streamed one), its
    token id returned, the remote-decode request."""
    out = {k: v for k, v in body.items() if k != "stream_options"}
    return {**out, "max_tokens": 1, "stream": False, "return_token_ids": True,
            "kv_transfer_params": dict(REMOTE_DECODE)}


def decode_body(body: dict, kv_transfer_params: dict) -> dict:
    """The decode server's body: the request's own with the prefill's ``kv_transfer_params``
    (400 when they do not ask for a remote prefill: they did not come from a prefill server)."""
    if not kv_transfer_params.get("do_remote_prefill"):
        raise APIError(400, "kv_transfer_params: not a prefill server's hand-off (no do_remote_prefill)",
                       param="kv_transfer_params")
    return {**body, "kv_transfer_params": kv_transfer_params}


def prefill_reply(answer: dict, prompt_tokens: int, seconds: float) -> PrefillReply:
    """The router's :class:`PrefillReply` from the prefill server's JSON answer, which took
    ``seconds`` (its queue inside: ``queue_s`` 0). 502 when vLLM gave no ``kv_transfer_params``
    (its connector did not take the request: nothing for a decode server to pull)."""
    params = answer.get("kv_transfer_params")
    if not isinstance(params, dict) or not params.get("do_remote_prefill"):
        raise APIError(502, "vLLM's prefill answer carries no kv_transfer_params for a remote decode "
                            f"(got {params!r}): is its --kv-transfer-config set?", code="kv_transfer_failed")
    choice = (answer.get("choices") or [{}])[0]
    ids = choice.get("token_ids") or []
    usage = answer.get("usage") or {}
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return PrefillReply(token=int(ids[0]) if ids else 0, prompt_tokens=int(usage.get("prompt_tokens", prompt_tokens)),
                        cached_tokens=cached, queue_s=0.0, prefill_s=max(0.0, seconds), kv_blocks=0, kv_bytes=0,
                        l3_get_s=0.0, l3_put_s=0.0, cached_by_tier=TierTokens(L1=cached),
                        kv_transfer_params=params)
