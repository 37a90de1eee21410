"""The KV namespaces of a fleet of more than one engine (warmpath's and vLLM's) behind one
router (pure, no I/O).

A namespace (``kv/hashing.KVNamespace``) enters every block key, so the index keeps each
namespace's keys apart by construction: a vLLM worker's re-keyed blocks (``vllm:<model dir>``,
32-token blocks) never equal a warmpath worker's. The router hashes a prompt once per
namespace present; a candidate worker's prefix hit is looked up with its own namespace's keys
and counted in the request's blocks (``in_request_blocks``), so candidates compare by cached
tokens. Rules on registration (:meth:`FleetNamespaces.admit`):

* every namespace serves the same model and token ids (model id, tokenizer, adapter) as the
  fleet's first one (its KV may differ: engine, dtype, block size);
* the P/D roles (``pre-prefill``, ``prefill``, ``decode``) are held by one engine and in one
  namespace only, so a handoff (prefill → decode, PPD) never crosses engines (warmpath's goes
  through its L3 store, vLLM's through vLLM's KV connector: ``router/handoff.py``) nor
  namespaces; workers of other namespaces serve as replicas.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from warmpath.kv.hashing import KVNamespace
from warmpath.routing.views import PrefixHit


def same_model(a: KVNamespace, b: KVNamespace) -> bool:
    """``a`` and ``b`` give a prompt's token ids the same meaning (model, tokenizer, adapter)."""
    return (a.model_id, a.tokenizer, a.adapter) == (b.model_id, b.tokenizer, b.adapter)


def in_request_blocks(hit: PrefixHit, worker_block: int, request_block: int) -> PrefixHit:
    """``hit`` (in blocks of ``worker_block`` tokens) as whole blocks of the request's size:
    the cached tokens, rounded down."""
    if worker_block == request_block:
        return hit
    local = hit.local_blocks * worker_block // request_block
    return PrefixHit(local, (hit.local_blocks + hit.l3_blocks) * worker_block // request_block - local)


@dataclass
class FleetNamespaces:
    """Each registered worker's namespace and whether it holds a P/D role."""

    of: dict[str, KVNamespace] = field(default_factory=dict)
    pd: dict[str, bool] = field(default_factory=dict)
    engine: dict[str, str] = field(default_factory=dict)

    def check(self, worker: str, role: str, ns: KVNamespace, first: KVNamespace | None,
              engine: str = "warmpath") -> None:
        """``ValueError`` (saying why) when the rules above refuse ``worker`` of ``engine``
        serving ``ns`` in ``role`` (``first``: the fleet's first namespace, ``None`` before any)."""
        if first is not None and not same_model(ns, first):
            raise ValueError(f"worker {worker} serves a different model/KV layout (model {ns.model_id!r}, "
                             f"tokenizer {ns.tokenizer!r}; the fleet serves {first.model_id!r}, {first.tokenizer!r})")
        if role != "replica":
            engines = {self.engine.get(w, "warmpath") for w in self.of if self.pd.get(w) and w != worker}
            if engines and engine not in engines:
                raise ValueError(f"worker {worker} ({engine}): the P/D roles are held by {next(iter(engines))} "
                                 f"workers; a hand-off never crosses engines (warmpath's goes through its L3 store, "
                                 f"vLLM's through its KV connector), so a {engine} worker registers as a replica")
            held = {n for w, n in self.of.items() if self.pd.get(w) and w != worker}
            if held and ns not in held:
                raise ValueError(f"worker {worker}: the P/D roles are held in another KV namespace "
                                 f"({next(iter(held)).revision!r}); a handoff never crosses namespaces, so a worker "
                                 f"of {ns.revision!r} registers as a replica")

    def add(self, worker: str, role: str, ns: KVNamespace, engine: str = "warmpath") -> None:
        """Record a registered worker's namespace and engine (after :meth:`check`)."""
        self.of[worker], self.pd[worker], self.engine[worker] = ns, role != "replica", engine

    def admit(self, worker: str, role: str, ns: KVNamespace, first: KVNamespace | None,
              engine: str = "warmpath") -> None:
        """:meth:`check`, then :meth:`add`."""
        self.check(worker, role, ns, first, engine)
        self.add(worker, role, ns, engine)

    def engine_of(self, worker: str) -> str:
        """The engine ``worker`` registered with (``warmpath`` when unknown)."""
        return self.engine.get(worker, "warmpath")

    def drop(self, worker: str) -> None:
        self.of.pop(worker, None)
        self.pd.pop(worker, None)
        self.engine.pop(worker, None)

    def others(self, first: KVNamespace | None) -> list[KVNamespace]:
        """The namespaces present besides ``first``, in registration order."""
        return list(dict.fromkeys(n for n in self.of.values() if n != first))
