"""How a prompt's KV goes from its prefill worker to its decode worker, per engine (pure).

The router runs every P/D request the same way (``flow.py``: ``/internal/prefill`` on the
prefill worker, then ``/internal/generate`` on the decode worker); what travels between the
two calls depends on the engine both workers run (the router admits the P/D roles of one
engine only, ``namespaces.py``):

* :class:`L3Handoff` (warmpath's engine): the prefill worker writes the prompt's blocks
  through to L3 and answers with the first token, which is the request's (TTFT is taken
  there); the decode worker gets that token, reports it at once and loads the blocks;
* :class:`ConnectorHandoff` (vLLM): the prefill worker's vLLM keeps the prompt's blocks for
  its KV connector and answers with ``kv_transfer_params``; the decode worker's vLLM gets
  them, pulls the blocks and computes every token, the first one included (TTFT is taken
  when the decode worker's first token comes).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import orjson

from warmpath.protocol.errors import APIError
from warmpath.protocol.internal import PrefillReply, PrefillStage
from warmpath.router.dispatch import UpstreamError


def stage(reply: PrefillReply) -> PrefillStage:
    """The prefill stage's measurements as the decode worker gets them."""
    return PrefillStage(cached_tokens=reply.cached_tokens, cached_by_tier=reply.cached_by_tier,
                        kv_bytes=reply.kv_bytes, kv_blocks=reply.kv_blocks)


class Handoff(ABC):
    """One engine's P→D hand-off, as the router sees it."""

    engine: str

    @abstractmethod
    def check(self, reply: PrefillReply, worker: str) -> None:
        """:class:`UpstreamError` (502) when ``worker``'s reply cannot be handed off."""

    @abstractmethod
    def first_token(self, reply: PrefillReply) -> int | None:
        """The request's first token when the prefill worker produced it, else ``None``."""

    @abstractmethod
    def decode_fields(self, reply: PrefillReply) -> dict:
        """The hand-off fields of the decode worker's ``GenerateRequest``."""


class L3Handoff(Handoff):
    """warmpath's engine: the first token and the blocks in L3."""

    engine = "warmpath"

    def check(self, reply: PrefillReply, worker: str) -> None:
        if reply.kv_transfer_params is not None:
            _malformed(worker, "kv_transfer_params from a warmpath prefill worker")

    def first_token(self, reply: PrefillReply) -> int | None:
        return reply.token

    def decode_fields(self, reply: PrefillReply) -> dict:
        return {"first_token": reply.token, "prefill": stage(reply)}


class ConnectorHandoff(Handoff):
    """vLLM: ``kv_transfer_params`` from the prefill server to the decode server."""

    engine = "vllm"

    def check(self, reply: PrefillReply, worker: str) -> None:
        if not reply.kv_transfer_params:
            _malformed(worker, "no kv_transfer_params from a vLLM prefill worker")

    def first_token(self, reply: PrefillReply) -> int | None:
        return None

    def decode_fields(self, reply: PrefillReply) -> dict:
        return {"kv_transfer_params": reply.kv_transfer_params, "prefill": stage(reply)}


HANDOFFS: dict[str, Handoff] = {h.engine: h for h in (L3Handoff(), ConnectorHandoff())}


def handoff_for(prefill_engine: str, decode_engine: str) -> Handoff:
    """The hand-off between workers of these engines; :class:`UpstreamError` (500) for two
    engines (registration refuses that fleet, so this is a bug, said plainly)."""
    if prefill_engine != decode_engine or prefill_engine not in HANDOFFS:
        err = APIError(500, f"no hand-off from a {prefill_engine} prefill worker to a {decode_engine} decode worker")
        raise UpstreamError(500, orjson.dumps(err.body()))
    return HANDOFFS[prefill_engine]


def _malformed(worker: str, what: str) -> None:
    err = APIError(502, f"worker {worker} answered a prefill reply that cannot be handed off: {what}")
    raise UpstreamError(502, orjson.dumps(err.body()))
