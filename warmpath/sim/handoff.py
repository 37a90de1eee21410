"""How a prefill→decode handoff works in a simulated PD cluster (pure, no torch).

warmpath's own handoff (the defaults): the prefill worker's first token goes to the client,
its KV is written through to the shared store and the decode worker loads only the blocks
it lacks; a later turn's prefill reuses what any tier holds. The PPD paper's baseline is
vLLM's one-way P2P connector (its §2.2, B.2): the client's first token comes from the decode
worker once the KV has arrived, and the P node cannot reach the history the D node computed,
so a remote turn 2+ recomputes the whole conversation and sends all of its KV.
:class:`PDHandoff` lets ``warmpath repro ppd`` and ``benchmarks/repro/ppd_search.py`` try either.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

FIRST_TOKEN = ("prefill", "decode")
KINDS = ("warmpath", "vllm")   # the named handoffs of ``--pd-handoff``


@dataclass(frozen=True)
class PDHandoff:
    """``extra_s``: fixed seconds per handoff on top of the network round trip (KV-transfer
    setup, the proxy's second hop). ``first_token``: ``"prefill"`` (warmpath relays the
    prefill's token) or ``"decode"`` (TTFT ends at the decode worker's first token, after its
    KV load and its step). ``recompute``: a remote turn 2+ shares no KV with earlier turns —
    the prefill worker recomputes the whole prompt and the decode worker loads all of it."""

    extra_s: float = 0.0
    first_token: str = "prefill"
    recompute: bool = False

    def __post_init__(self) -> None:
        if self.extra_s < 0:
            raise ValueError(f"handoff extra_s must be >= 0, got {self.extra_s}")
        if self.first_token not in FIRST_TOKEN:
            raise ValueError(f"handoff first_token must be one of {FIRST_TOKEN}, got {self.first_token!r}")

    @classmethod
    def named(cls, kind: str, extra_ms: float = 0.0) -> "PDHandoff":
        """``warmpath`` (the defaults) or ``vllm`` (first token at the decode worker, turn 2+
        recomputed), with ``extra_ms`` per handoff: ``--pd-handoff`` / ``--handoff-extra-ms``."""
        if kind not in KINDS:
            raise ValueError(f"handoff must be one of {KINDS}, got {kind!r}")
        vllm = kind == "vllm"
        return cls(extra_ms / 1e3, "decode" if vllm else "prefill", vllm)

    def kv_hashes(self, rid: str, turn: int, hashes: tuple[bytes, ...] | list[bytes]) -> list[bytes] | None:
        """The block hashes a remote turn's prefill and decode sequences use: ``None`` (the
        prompt's own) unless ``recompute`` and a follow-up, then hashes salted by the request
        id, so no tier holds any of them (both sides see the same salted chain)."""
        if not self.recompute or turn == 0:
            return None
        salt = rid.encode()
        return [hashlib.blake2b(h + salt, digest_size=len(h)).digest() for h in hashes]
