"""Router ↔ worker messages (``/internal/*``), defined once and used on both sides.

``POST /internal/prefill`` (router → prefill worker): :class:`PrefillRequest` →
:class:`PrefillReply`. ``POST /internal/generate`` (router → decode worker or replica):
:class:`GenerateRequest` → the client's OpenAI response. ``POST /internal/register`` and
``/internal/heartbeat`` (worker → router): :class:`Registration`, :class:`Heartbeat`.
``POST /internal/drain`` (cluster manager → router): :class:`Drain` → :class:`DrainState`.
Router ↔ router (``--peer``): ``POST /internal/peer`` :class:`PeerState`, ``GET
/internal/peer/workers`` → :class:`PeerWorkers`.
Index fidelity (``vllm/fidelity.py``): ``GET /internal/kv/cached`` (a vLLM worker) →
:class:`CachedBlocks`; ``POST /internal/kv/held`` (router): :class:`HeldQuery` → :class:`HeldReply`.
Every field is typed and range-checked: a malformed message is a 400 and changes nothing.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from warmpath.protocol.openai import (INT32_MAX, MAX_REPETITION_PENALTY, MAX_TEMPERATURE, MIN_REPETITION_PENALTY,
                                      SamplingFields, TokenId)

MAX_PROMPT_IDS = 1 << 21
PromptIds = Annotated[list[TokenId], Field(min_length=1, max_length=MAX_PROMPT_IDS)]
WorkerId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,64}$")]
HttpUrl = Annotated[str, StringConstraints(pattern=r"^https?://[^\s/]+(/[^\s]*)?$", max_length=512)]
ZmqEndpoint = Annotated[str, StringConstraints(pattern=r"^(tcp|ipc|inproc)://\S+$", max_length=512)]
KeyHex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]   # a block key (kv/hashing.py)
MAX_HELD_KEYS = 1 << 22
Role = Literal["pre-prefill", "prefill", "decode", "replica"]
Engine = Literal["warmpath", "vllm"]
# vLLM's KV connector hand-off fields (``kv_transfer_params``), relayed opaquely by the router
KVTransferParams = Annotated[dict[str, Any], Field(max_length=64)]
Rate = Annotated[float, Field(gt=0, allow_inf_nan=False)]
_STRICT = ConfigDict(strict=True, extra="forbid")


class PrefillRequest(BaseModel):
    """Run ``prompt_token_ids`` to its first token (the prefill side of a handoff)."""

    model_config = _STRICT
    prompt_token_ids: PromptIds
    request: SamplingFields


class TierTokens(BaseModel):
    """Prompt tokens by where their KV came from: ``L1`` reused on the device, ``L2`` /
    ``L3`` loaded from host DRAM / the store."""

    model_config = _STRICT
    L1: int = Field(0, ge=0)
    L2: int = Field(0, ge=0)
    L3: int = Field(0, ge=0)


class PrefillReply(BaseModel):
    """What a prefill worker measured (the L3 seconds are the worker's while the request
    ran: other requests' reads and writes in that time are in them too).

    ``cached_tokens``: prompt tokens this worker did not compute (``cached_by_tier`` says
    from where). ``kv_bytes``: bytes this worker wrote to L3 for this request (blocks the
    store took now; 0 without write-through or L3). ``kv_blocks``: full prompt blocks this
    worker knows are in L3 after it (written now or already there).

    ``kv_transfer_params``: set by a vLLM prefill worker (its KV connector's hand-off, from
    vLLM's answer); the router passes them to the decode worker, which then computes the first
    token itself from the pulled KV (``token`` is the prefill's own, not the request's)."""

    model_config = _STRICT
    token: TokenId
    prompt_tokens: int = Field(ge=1)
    cached_tokens: int = Field(ge=0)
    queue_s: float = Field(ge=0)
    prefill_s: float = Field(ge=0)
    kv_blocks: int = Field(ge=0)
    kv_bytes: int = Field(ge=0)
    l3_get_s: float = Field(ge=0)
    l3_put_s: float = Field(ge=0)
    cached_by_tier: TierTokens = TierTokens()
    kv_transfer_params: KVTransferParams | None = None


class PrefillStage(BaseModel):
    """The prefill worker's own measurements, relayed by the router to the decode worker
    (which reports them, as measured by that worker, in ``usage["warmpath"]["prefill"]``)."""

    model_config = _STRICT
    cached_tokens: int = Field(ge=0)
    cached_by_tier: TierTokens | None = None
    kv_bytes: int | None = Field(None, ge=0)
    kv_blocks: int | None = Field(None, ge=0)


class GenerateRequest(BaseModel):
    """Generate the answer; with ``first_token`` this is the decode side of a handoff
    through L3 (warmpath's engine), with ``kv_transfer_params`` the decode side of a handoff
    through vLLM's KV connector (the prefill reply's, passed on as they came).

    ``prefill``: what the prefill stage measured (from its :class:`PrefillReply`)."""

    model_config = _STRICT
    kind: Literal["chat", "text"]
    prompt_token_ids: PromptIds
    request: SamplingFields
    first_token: TokenId | None = None
    prefill: PrefillStage | None = None
    kv_transfer_params: KVTransferParams | None = None


class AnswerTiming(BaseModel):
    """A worker's own timings of one answer it computed and decoded (``usage["warmpath"]["timing"]``),
    which the router's cost model learns from (``routing/latency.py``): the prompt's tokens it
    computed vs found cached and the seconds from the request's arrival to its first token
    (``queue_s`` of them waiting, when the worker knows it); the seconds from the first token
    to the last over ``decode_steps`` steps (tokens after the first) and the mean number of
    sequences decoding beside it (``batch``, itself included)."""

    model_config = ConfigDict(extra="ignore")
    computed_tokens: int = Field(ge=0)
    cached_tokens: int = Field(ge=0)
    prefill_s: float = Field(ge=0, allow_inf_nan=False)
    queue_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    decode_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    decode_steps: int = Field(0, ge=0)
    batch: float = Field(1.0, ge=1, allow_inf_nan=False)


class StageLoads(BaseModel):
    """What a worker reports of its own part of an answer (``usage["warmpath"]["decode"]`` after
    a handoff, else ``["worker"]``): prompt tokens whose KV it reused (L1) or loaded (L2/L3),
    those it recomputed, and the seconds its L3 loads took (0: none, or not measured)."""

    model_config = ConfigDict(extra="ignore")
    loaded_tokens: dict[Literal["L1", "L2", "L3"], Annotated[int, Field(ge=0)]]
    recomputed_tokens: int = Field(ge=0)
    l3_load_s: float = Field(0.0, ge=0, allow_inf_nan=False)


class Namespace(BaseModel):
    """The KV namespace a worker serves (``kv.hashing.KVNamespace`` on the wire)."""

    model_config = _STRICT
    model_id: Annotated[str, StringConstraints(min_length=1, max_length=512)]
    revision: Annotated[str, StringConstraints(max_length=256)]
    dtype: Annotated[str, StringConstraints(max_length=32)]
    block_size: int = Field(ge=1, le=1 << 16)
    tokenizer: Annotated[str, StringConstraints(max_length=256)] = ""
    adapter: Annotated[str, StringConstraints(max_length=256)] = ""
    cache_salt: Annotated[str, StringConstraints(max_length=512)] = ""


class SamplingDefaults(BaseModel):
    """What a worker gives a request that leaves these fields out (``models.generation``),
    with each value's source; the router shows the first worker's on ``/v1/models``."""

    model_config = _STRICT
    temperature: float = Field(ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False)
    top_p: float = Field(gt=0, le=1, allow_inf_nan=False)
    top_k: int = Field(ge=0, le=INT32_MAX)
    min_p: float = Field(ge=0, le=1, allow_inf_nan=False)
    repetition_penalty: float = Field(ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY, allow_inf_nan=False)
    max_tokens: int = Field(ge=1, le=INT32_MAX)
    sources: dict[Annotated[str, StringConstraints(max_length=32)],
                  Annotated[str, StringConstraints(max_length=256)]] = Field({}, max_length=8)


class Registration(BaseModel):
    """A worker introduces itself to the router."""

    model_config = _STRICT
    worker_id: WorkerId
    role: Role
    url: HttpUrl
    namespace: Namespace
    engine: Engine = "warmpath"          # how its P/D hand-off travels (router/handoff.py)
    pid: int | None = Field(None, ge=0, le=2**31)
    kv_bytes_per_token: int = Field(46080, ge=1, le=1 << 30)
    max_model_len: int | None = Field(None, ge=1, le=1 << 24)
    events_endpoint: ZmqEndpoint | None = None
    replay_endpoint: ZmqEndpoint | None = None
    generation_defaults: SamplingDefaults | None = None
    # what it can hold at once (the router's admission limit is sized from these; None: unknown)
    max_num_seqs: int | None = Field(None, ge=1, le=1 << 20)
    kv_capacity_tokens: int | None = Field(None, ge=1, le=1 << 40)
    overlaps_loads: bool = False         # its L3 loads run beside its engine's steps (--kv-l3-overlap)
    # prompt tokens its scheduler computes per step (--max-num-batched-tokens): the router's
    # predictions chunk a prompt as this worker will
    prefill_chunk_tokens: int | None = Field(None, ge=1, le=1 << 24)


class Heartbeat(BaseModel):
    """A worker's periodic load report; ``healthy=False`` asks the router to drop it now
    (its engine failed; it is about to exit and be restarted). ``draining=True``: it is
    shutting down (SIGTERM, ``worker/drain.py``): route nothing new to it, let the requests
    under way finish; with ``healthy=False`` it has drained and leaves."""

    model_config = _STRICT
    worker_id: WorkerId
    queued_prefill_tokens: int = Field(0, ge=0, le=2**62)
    running: int = Field(0, ge=0, le=2**31)
    kv_usage: float = Field(0.0, ge=0, le=1, allow_inf_nan=False)
    prefill_tok_s: Rate = 500.0
    l2_bytes_s: Rate = 4e9
    l3_bytes_s: Rate = 4e8
    healthy: bool = True
    draining: bool = False
    detail: Annotated[str, StringConstraints(max_length=1024)] | None = None
    # the role it serves now: a router that does not decide roles (one of several) follows it
    role: Role | None = None

    def load(self) -> dict:
        """The load fields of a ``WorkerView`` (not the id, the health, the drain, the detail or the role)."""
        return self.model_dump(exclude={"worker_id", "healthy", "draining", "detail", "role"})


class Drain(BaseModel):
    """``POST /internal/drain`` (operator or cluster manager → router): ``drain`` stops
    routing new requests to the worker (those it already has run to their end), ``resume``
    routes to it again, ``remove`` forgets it now (after it was stopped)."""

    model_config = _STRICT
    worker_id: WorkerId
    action: Literal["drain", "resume", "remove"] = "drain"


class DrainState(BaseModel):
    """The answer to :class:`Drain`: whether the worker is registered and draining, and how
    many requests the router has on it now (prefills and decodes not yet ended)."""

    worker_id: str
    registered: bool
    draining: bool
    in_flight: int


class CachedBlocks(BaseModel):
    """``GET /internal/kv/cached`` (a vLLM worker): the blocks its vLLM server has cached by
    its own events (``kv/vllm_truth.py``): ``blocks`` in all, ``keys`` (warmpath key hex →
    how many cached vLLM blocks have it), ``unkeyed`` (vLLM hashes the relay could not
    re-key); the relay's lost and malformed batches so far (the truth misses what they held)."""

    worker_id: str
    blocks: int = Field(ge=0)
    keys: dict[KeyHex, Annotated[int, Field(ge=1)]]
    unkeyed: list[str]
    other_medium: int = Field(ge=0)
    unmatched_removes: int = Field(ge=0)
    lost_batches: int = Field(ge=0)
    malformed_batches: int = Field(ge=0)


class HeldQuery(BaseModel):
    """``POST /internal/kv/held`` (a fidelity sampler → router): which of ``keys`` the
    router's index holds for ``worker_id`` in the worker's own tiers."""

    model_config = _STRICT
    worker_id: WorkerId
    keys: Annotated[list[KeyHex], Field(max_length=MAX_HELD_KEYS)]


class HeldReply(BaseModel):
    """The answer to :class:`HeldQuery`: ``held`` of ``asked``, the positions ``missing``,
    the keys the index holds for the worker in all (``indexed``), whether its events went
    stale (the router then routes on hints too), and ``mirror_mismatch`` (asked keys on which
    the index's lookup mirror and its own sets disagree: a bookkeeping fault if not 0)."""

    worker_id: str
    asked: int
    held: int
    missing: list[int]
    indexed: int
    stale: bool
    mirror_mismatch: int


class PeerLoad(BaseModel):
    """What one router has sent one worker and not yet seen finish (``routing/load.py``)."""

    model_config = _STRICT
    prefill_tokens: int = Field(0, ge=0, le=2**62)
    running: int = Field(0, ge=0, le=2**31)
    prefilling: int = Field(0, ge=0, le=2**31)
    context_tokens: int = Field(0, ge=0, le=2**62)


MAX_PEER_WORKERS = 4096
MAX_PEER_TURNS = 4096


class PeerTurn(BaseModel):
    """A session's turn that ended on the reporting router: where its KV is now."""

    model_config = _STRICT
    session: Annotated[str, StringConstraints(min_length=1, max_length=512)]
    decode: WorkerId | None = None
    context_tokens: int = Field(0, ge=0, le=2**40)
    turns: int = Field(0, ge=0, le=2**31)


class PeerState(BaseModel):
    """``POST /internal/peer`` (router → each other router, every ``--peer-every-s``): its
    load per worker, its admission, how far it has read each worker's KV events and the
    session turns that ended on it since its last report, so the others count its work, the
    fleet limit is shared and a session's next turn finds its KV whichever router gets it
    (``routing/peers.py``)."""

    model_config = _STRICT
    router: HttpUrl
    loads: dict[WorkerId, PeerLoad] = Field(default_factory=dict, max_length=MAX_PEER_WORKERS)
    in_flight: int = Field(0, ge=0, le=2**31)
    waiting: int = Field(0, ge=0, le=2**31)
    index_blocks: dict[Literal["local", "l3", "approx"], Annotated[int, Field(ge=0, le=2**62)]] = Field(
        default_factory=dict)
    event_seqs: dict[WorkerId, Annotated[int, Field(ge=0, le=2**62)]] = Field(
        default_factory=dict, max_length=MAX_PEER_WORKERS)
    turns: list[PeerTurn] = Field(default_factory=list, max_length=MAX_PEER_TURNS)   # since its last report


class PeerWorkers(BaseModel):
    """``GET /internal/peer/workers``: the registrations a router holds, for a router that
    starts beside it (it follows those workers at once instead of waiting for their next
    heartbeat)."""

    model_config = _STRICT
    workers: list[Registration] = Field(default_factory=list, max_length=MAX_PEER_WORKERS)
