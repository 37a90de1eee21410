"""Snapshots the routing policies decide on (plain data, no torch, no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

ROLES = ("pre-prefill", "prefill", "decode", "replica")


@dataclass(frozen=True)
class WorkerView:
    """One worker as the router sees it at decision time.

    Speeds are what the worker measured and reported in its heartbeat.
    """

    worker_id: str
    role: str
    queued_prefill_tokens: int = 0     # prompt tokens waiting or being prefilled
    running: int = 0                   # sequences decoding
    kv_usage: float = 0.0              # L1 blocks in use (0-1)
    prefill_tok_s: float = 500.0
    l2_bytes_s: float = 4e9
    l3_bytes_s: float = 4e8
    max_seqs: int | None = None        # sequences its scheduler runs at once (registration)
    kv_tokens: int | None = None       # tokens its L1 KV pool holds (registration)
    overlaps_loads: bool = False       # its L3 loads run beside its steps, not in them (registration)
    chunk_tokens: int | None = None    # prompt tokens its scheduler computes per step (registration; None: unchunked)
    default_max_tokens: int | None = None   # what a request without max_tokens gets there (registration)
    running_tokens: int = 0            # context tokens of the running sequences (0: unknown)
    prefilling: int = 0                # of the running: still computing their own prompt here
    # handoffs bound here, their prompts computing elsewhere (each one decode more once it lands):
    # (seconds until their first token is predicted back, seconds of the KV load each will make
    # this worker pay), soonest first
    incoming: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if self.prefill_tok_s <= 0:
            raise ValueError("prefill_tok_s must be > 0")


@dataclass(frozen=True)
class RequestView:
    """The request being routed: its block hashes (full blocks: a tuple, or the router's
    ``kv.keychain.KeyChain``, one buffer) and session. ``ns_hashes``: its block hashes in each
    other namespace of the fleet (unsalted namespace → hashes; ``routing/namespaces.py``)."""

    num_tokens: int
    block_hashes: Sequence[bytes]
    block_size: int
    session_id: str | None = None
    turn: int = 1
    new_tokens: int | None = None      # turn 2+: tokens not in the session's history
    # the answer's token budget: the client's max_tokens, else the decode worker's default
    max_tokens: int = field(kw_only=True)
    ns_hashes: dict = field(default_factory=dict, compare=False)
    waited_s: float = 0.0              # held by the router so far (the goodput policy's hold)
    tenant: str = "default"            # whom it is for (routing/tenants.py)
    priority: int = 0                  # smaller is more urgent (vLLM's polarity)


@dataclass(frozen=True)
class PrefixHit:
    """Leading blocks of a request cached for one worker: locally (L1/L2) and in L3."""

    local_blocks: int = 0
    l3_blocks: int = 0                 # after the local ones


@dataclass
class Snapshot:
    """Everything a policy may look at: workers, cached prefixes, the session's decode worker."""

    workers: list[WorkerView]
    hits: dict[str, PrefixHit] = field(default_factory=dict)
    session_decode_worker: str | None = None
    kv_bytes_per_token: int = 46080
    network_bytes_s: float = 1e9
    model: object | None = None        # the router's learnt RouterModel (None: heartbeat speeds)
    arrivals_s: dict = field(default_factory=dict)   # class -> requests/s arriving (recent)
    now: float = 0.0

    def by_role(self, *roles: str) -> list[WorkerView]:
        return [w for w in self.workers if w.role in roles]


def predicted_headers(d: "Decision") -> dict[str, str]:
    """The router's predictions for a response's headers (``bench/requests_log.route_from_http``
    reads them back): TTFT always, TPOT where the policy predicted it, the PPD switch's score
    where it decided (the path itself is ``X-Warmpath-Route``)."""
    out = {"X-Warmpath-Predicted-TTFT-S": f"{d.est_ttft_s:.6f}"}
    if d.est_tpot_s is not None:
        out["X-Warmpath-Predicted-TPOT-S"] = f"{d.est_tpot_s:.6f}"
    if d.ppd_reason is not None:
        out["X-Warmpath-PPD"] = d.ppd_reason.encode("ascii", "replace").decode()
    return out


@dataclass(frozen=True)
class Decision:
    """Where a request goes and why (``prefill`` is ``None`` for local append-prefill)."""

    prefill: str | None
    decode: str | None
    path: str                          # "cold" | "warm" | "local" | "replica" | "pd" (its class: ``cls``)
    est_ttft_s: float
    cached_tokens: int
    reason: str
    ppd: str | None = None             # turn 2+ under PPD: "local" | "remote"
    cls: str = ""                      # "cold" | "warm": the request's class (routing/classify.py)
    bucket: tuple | None = None        # PPD: the bucket the switch decided in (for its feedback)
    ppd_reason: str | None = None      # PPD: why the switch went that way (its score and terms)
    ppd_queue_s: float = 0.0           # PPD: the path's predicted queue wait (off its observed TTFT)
    est_tpot_s: float | None = None    # its predicted TPOT (routing/predict.py), where predicted
    est_running_tpot_s: float | None = None   # the decode worker's running requests' predicted TPOT
    est_tpot_parts: tuple[float, float] | None = None   # est_tpot_s = chunks' share + κ · decode steps' share
    est_ttft_parts: tuple[float, float] | None = None   # local on an idle worker: est_ttft_s = fixed + ρ · chunks
    est_handoff_load_s: float = 0.0    # handed off: the KV load it makes its decode worker pay (predicted)
    hold_s: float = 0.0                # > 0: not dispatched; decide again after this long (goodput's hold)
