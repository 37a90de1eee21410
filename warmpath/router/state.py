"""The router's shared state: configuration, registered workers, the KV index, sessions,
admission, load and metrics; the HTTP handlers and the KV event threads share it."""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from warmpath.kv.events import AllBlocksCleared, KVEventSubscriber
from warmpath.kv.hash_cache import BlockHashCache
from warmpath.kv.hashing import KVNamespace
from warmpath.models.tokenizer import TextTokenizer
from warmpath.protocol.auth import bearer
from warmpath.protocol.errors import bad
from warmpath.protocol.http import DEFAULT_MAX_BODY_BYTES
from warmpath.routing.admission import Admission, AdmissionConfig
from warmpath.router.dashboard import Dashboard
from warmpath.routing.ledger import RequestLedger
from warmpath.routing.index import GlobalKVIndex
from warmpath.routing.elastic import ElasticConfig
from warmpath.routing.load import LoadBook
from warmpath.router.metrics import RouterMetrics
from warmpath.routing.namespaces import FleetNamespaces, in_request_blocks
from warmpath.routing.peers import PeerBook, PeerConfig
from warmpath.routing.tenants import DEFAULT_TENANT, TenantConfig
from warmpath.routing.route import RouteDecider
from warmpath.routing.policy import RoutingPolicy
from warmpath.routing.ppd import PPDConfig, PPDTable
from warmpath.routing.registry import DiscoveryConfig, Registry
from warmpath.routing.sessions import SessionTable
from warmpath.routing.views import PrefixHit, RequestView, Snapshot

log = logging.getLogger(__name__)
TENANT_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True)
class RouterConfig:
    """The router's settings (``warmpath router`` flags)."""

    host: str = "127.0.0.1"
    port: int = 8000
    admission: AdmissionConfig = AdmissionConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()
    request_timeout_s: float = 600.0
    ppd: PPDConfig | None = None          # None: turn 2+ always goes through a prefill worker
    session_idle_s: float = 3600.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    cluster_token: str | None = field(default=None, repr=False)   # /internal/*, to workers, KV events
    api_keys: tuple[str, ...] = field(default=(), repr=False)     # /v1/* (none: open)
    elastic: ElasticConfig = ElasticConfig(enabled=False)         # role changes (routing/elastic.py)
    peers: PeerConfig = PeerConfig()       # the other routers of an active-active fleet (routing/peers.py)
    tenants: TenantConfig = TenantConfig()  # API key -> tenant, per-tenant limits (routing/tenants.py)
    advertise_url: str | None = None       # how the other routers name this one (default http://host:port)

    @property
    def url(self) -> str:
        return self.advertise_url or f"http://{self.host}:{self.port}"


class RouterState:
    """Everything the router knows; the HTTP handlers and the event threads share it."""

    def __init__(self, policy: RoutingPolicy, tokenizer: TextTokenizer, model_id: str, cfg: RouterConfig,
                 ppd_table: PPDTable | None = None):
        self.tok, self.model_id, self.cfg = tokenizer, model_id, cfg
        self.decider = RouteDecider(policy, cfg.ppd, ppd_table, elastic=cfg.elastic)
        self.load = LoadBook()
        self.registry = Registry(cfg.discovery)
        self.index = GlobalKVIndex(stale_after_s=cfg.discovery.drop_after_s)
        self.sessions = SessionTable(cfg.session_idle_s)
        self.hash_cache = BlockHashCache()     # a session's next prompt rehashes only its new blocks
        self.admission = Admission(cfg.admission, cfg.tenants)
        self.metrics = RouterMetrics()
        self.namespace: KVNamespace | None = None     # the first registration's (requests' own blocks)
        self.namespaces = FleetNamespaces()           # each worker's (a fleet of two engines: routing/namespaces.py)
        self.kv_bytes_per_token = 46080
        self.max_model_len: int | None = None     # learnt from the first registration
        self.generation_defaults: dict | None = None   # the first registration's, as reported
        self.lock = threading.Lock()
        self.subs: dict[str, tuple[KVEventSubscriber, threading.Event]] = {}
        self.routed: dict[str, int] = {}
        self.waiters: dict[int, asyncio.Event] = {}
        self.mid_stream_failures = 0
        self.pids: dict[str, int | None] = {}
        self.gone: dict[str, asyncio.Event] = {}
        self.draining: set[str] = set()  # registered, finishing what they have, given nothing new
        self.dashboard = Dashboard()     # /dashboard's rings (router/dashboard.py)
        self.peers = PeerBook(cfg.peers)  # the other routers' last reports (routing/peers.py)
        self.registrations: dict = {}    # worker -> its Registration (what a starting peer router reads)
        self.reading: set[str] = set()   # workers whose KV snapshot is still being read (not ready until none)
        # sessions' turns ended here, for the peers' next report: (session, decode worker, context, turns)
        self.turns_out: collections.deque = collections.deque(maxlen=4096)
        # every request's books (admit, dispatch, end), kept as the simulator keeps them
        self.ledger = RequestLedger(self.decider, self.admission, self.sessions, self.routable)

    @property
    def policy(self) -> RoutingPolicy:
        return self.decider.policy

    def snapshot(self, rv: RequestView, session_decode: str | None) -> Snapshot:
        """The decider's snapshot now: registered workers with router-tracked load, and
        their prefix hits from the KV index."""
        now = time.monotonic()
        with self.lock:
            return self.decider.snapshot(self.load_views(now),
                                         lambda w: self.lookup(w, rv, now),
                                         session_decode, self.kv_bytes_per_token, now)

    def tenant_of(self, req) -> str:
        """Whom a request is for: its API key's tenant; on a router without API keys, its
        ``X-Tenant-Id`` header (``default`` when absent); ``APIError`` 400 for a bad header."""
        if self.cfg.api_keys:
            return self.cfg.tenants.keys.get(bearer(req) or "", DEFAULT_TENANT)
        t = req.headers.get("x-tenant-id")
        if t is None:
            return DEFAULT_TENANT
        if not TENANT_NAME.fullmatch(t):
            raise bad("x-tenant-id", f"X-Tenant-Id must be 1-64 of [A-Za-z0-9._-], got {t[:80]!r}")
        return t

    def decides_roles(self, now: float) -> bool:
        """Does this router move workers between roles? With elastic roles on: alone, yes;
        beside peers, only the one whose URL sorts first among those alive (the others take
        each worker's role from its heartbeats; a leader that dies is succeeded by the next)."""
        if not self.cfg.elastic.enabled:
            return False
        return not self.cfg.peers.peers or self.cfg.url <= min(self.peers.alive(now), default=self.cfg.url)

    def load_views(self, now: float) -> list:
        """The routable workers with the load this router and the other routers alive have sent them."""
        others = (lambda w: self.peers.load_of(w, now)) if self.peers.reports else None
        return self.load.views(self.routable(), now, others)

    def hashes_for(self, worker: str, rv: RequestView) -> Sequence[bytes]:
        """``rv``'s block keys in ``worker``'s namespace."""
        ns = self.namespaces.of.get(worker)
        return rv.block_hashes if ns is None or ns == self.namespace else rv.ns_hashes.get(ns, ())

    def lookup(self, worker: str, rv: RequestView, now: float) -> PrefixHit:
        """``worker``'s prefix hit for ``rv`` (call with the lock held): looked up with its own
        namespace's keys, counted in ``rv``'s blocks."""
        hit = self.index.lookup(worker, self.hashes_for(worker, rv), now)
        ns = self.namespaces.of.get(worker)
        return hit if ns is None else in_request_blocks(hit, ns.block_size, rv.block_size)

    def rebalance(self, now: float) -> None:
        """Elastic roles: apply a role change if the decider calls for one, over the load the
        policies see. From now on the worker gets its new role's traffic only; what it holds
        of the old one finishes there (``elastic.py``). Logged, counted per role and shown in
        the dashboard's role log with its reason."""
        if not self.decides_roles(now):
            return
        with self.lock:
            views = self.load_views(time.monotonic())
        ch = self.decider.rebalance(views, now, waiting=self.admission.waiting(), slots=self.admission.current.slots)
        if ch is not None and self.registry.set_role(ch.worker, ch.new):
            self.metrics.role_changes.labels(ch.new).inc()
            self.dashboard.note_change(ch.worker, ch.old, ch.new, ch.reason)
            log.info("worker %s: %s -> %s (%s)", ch.worker, ch.old, ch.new, ch.reason)

    def release(self, kv_tokens: int | None = None, tenant: str = DEFAULT_TENANT) -> None:
        """A request ended (having held ``kv_tokens`` of KV, prompt + answer, when it ran to
        its end): give its admission slot to the next waiter, if any."""
        self.wake(self.ledger.release(kv_tokens, tenant))

    def fit_admission(self) -> None:
        """Size the admission limit to the fleet now (a worker joined, left or changed role)."""
        self.wake(self.ledger.fit())

    def routable(self) -> list:
        """The registered workers new requests may go to (not draining)."""
        return [v for v in self.registry.views() if v.worker_id not in self.draining]

    def drain(self, worker: str, action: str) -> bool:
        """``drain`` / ``resume`` / ``remove`` a worker (``POST /internal/drain``); ``False``
        when it is not registered (``remove`` of an unknown worker, ``drain`` of one never
        seen)."""
        known = worker in self.registry.workers
        if action == "remove":
            return self.remove(worker, "drained")
        if action == "resume":
            self.draining.discard(worker)
        elif known:
            self.draining.add(worker)
            log.info("draining worker %s (%d in flight)", worker, self.load.in_flight(worker))
        self.fit_admission()
        return known

    def wake(self, keys: list) -> None:
        """Give the slots to these waiters (``RequestLedger.release``'s keys)."""
        for k in keys:
            if k in self.waiters:
                self.waiters.pop(k).set()

    def subscribe(self, worker: str, endpoint: str, replay: str) -> None:
        """Follow a worker's KV events (replacing the thread of an earlier registration)."""
        if worker in self.subs:
            self.subs.pop(worker)[1].set()
        stop = threading.Event()
        sub = KVEventSubscriber(endpoint, replay, token=self.cfg.cluster_token)

        def loop() -> None:
            try:
                held = sub.snapshot()   # what it holds now; then only the batches after it
                if held is not None:
                    with self.lock:
                        self.index.apply(worker, [AllBlocksCleared(), *held], time.monotonic())
                    self.metrics.snapshots.inc()
            except Exception:  # noqa: BLE001 - without a snapshot the events (and replay) still follow
                log.exception("KV snapshot of %s not read", worker)
                self.metrics.thread_errors.labels("events").inc()
            finally:
                self.reading.discard(worker)
            while not stop.is_set():
                try:
                    batches = sub.poll(200)
                    with self.lock:
                        for _, events, _ in batches:
                            self.index.apply(worker, events, time.monotonic())
                except Exception:  # noqa: BLE001 - a malformed batch must not end the thread
                    log.exception("KV events of %s: batch skipped", worker)
                    self.metrics.thread_errors.labels("events").inc()
                    stop.wait(0.2)
            sub.close()

        self.reading.add(worker)
        threading.Thread(target=loop, daemon=True, name=f"events-{worker}").start()
        self.subs[worker] = (sub, stop)

    def remove(self, worker: str, reason: str) -> bool:
        """Stop routing to a worker (until it registers again); ``False`` if unknown."""
        if self.registry.workers.pop(worker, None) is None:
            return False
        self.drop(worker)
        self.metrics.dropped.labels(reason).inc()
        log.warning("dropped worker %s (%s)", worker, reason)
        return True

    def gone_event(self, worker: str) -> asyncio.Event:
        """Set when ``worker`` is dropped (requests waiting on it give up and retry)."""
        ev = self.gone.get(worker)
        if ev is None:
            ev = self.gone[worker] = asyncio.Event()
        return ev

    def drop(self, worker: str) -> None:
        """Forget a worker's index entries, sessions and event thread; wake the requests
        that wait on it (call on the event loop)."""
        self.gone_event(worker).set()
        self.draining.discard(worker)
        self.registrations.pop(worker, None)
        self.namespaces.drop(worker)
        with self.lock:
            self.index.drop_worker(worker)
        self.sessions.forget_worker(worker)
        if worker in self.subs:
            self.subs.pop(worker)[1].set()
        self.fit_admission()
