"""Discrete-event simulation of a warmpath cluster (pure, deterministic for a seed).

The router part runs the production objects: the router's route decision
(``routing/route.py``: the routing policy ``cpd`` / ``pd`` / ``replica``, the PPD switch, the cold rule,
the elastic roles), admission, the
session table and the global KV index fed by the workers' events. Each worker runs the production scheduler and block manager
(``worker.py``). Only step times and transfers are modelled. The request flow mirrors
``router/flow.py``: prefill to the first token (blocks written through to L3), handoff to
the decode worker, which loads them and generates; PPD-local turns run on the decode worker.
A request the client gave up on (its timeout) is abandoned as the router and workers do.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field, replace

from warmpath.bench.metrics import Record
from warmpath.bench.workload import Session
from warmpath.engine.sequence import SamplingParams, Sequence
from warmpath.kv.hashing import KVNamespace, hash_prefix_blocks
from warmpath.routing import ppd
from warmpath.routing.admission import Admission, AdmissionConfig
from warmpath.routing.index import GlobalKVIndex
from warmpath.routing.ledger import RequestLedger
from warmpath.routing.load import LoadBook
from warmpath.routing.policy import RoutingPolicy
from warmpath.routing.sessions import SessionTable
from warmpath.routing.elastic import ElasticConfig
from warmpath.routing.latency import PrefillObservation
from warmpath.routing.route import RouteDecider
from warmpath.routing.views import Decision, WorkerView
from warmpath.sim.client import Req, SimClient
from warmpath.sim.cpu import SharedCores
from warmpath.sim.handoff import PDHandoff
from warmpath.sim.ending import Endings
from warmpath.sim.store import SimStore
from warmpath.sim.worker import SimWorker


@dataclass
class SimStats:
    events: int = 0
    handoff_bytes: float = 0.0
    ppd_local: int = 0
    ppd_remote: int = 0
    rejected: int = 0
    routed: dict = field(default_factory=dict)
    role_changes: list = field(default_factory=list)   # (time, worker, new role)


class Simulation(Endings):
    """Run sessions through simulated workers; ``run()`` returns the client-side records."""

    def __init__(self, workers: list[SimWorker], policy: RoutingPolicy, namespace: KVNamespace,
                 store: SimStore | None, index: GlobalKVIndex, kv_bytes_per_token: int,
                 nic_bytes_s: float, admission: AdmissionConfig = AdmissionConfig(),
                 ppd_cfg: ppd.PPDConfig | None = None, ppd_table: ppd.PPDTable | None = None,
                 net_latency_s: float = 2e-4, cpu_cores: int | None = None,
                 request_overhead_s: float = 0.0, retokenize_miss: float = 0.0,
                 transfer_cpu: float = 0.0, contention: float = 0.0,
                 elastic: ElasticConfig = ElasticConfig(enabled=False),
                 max_concurrency: int | None = None, handoff: PDHandoff = PDHandoff(),
                 timeout_s: float | None = None) -> None:
        self.workers = {w.wid: w for w in workers}
        self.ns, self.store, self.index = namespace, store, index
        self.kvb = kv_bytes_per_token
        self.decider = RouteDecider(policy, ppd_cfg, ppd_table, network_bytes_s=nic_bytes_s, elastic=elastic)
        self._next_rebalance = 0.0
        self.admission = Admission(admission)
        self.sessions = SessionTable()
        # every request's books (admit, dispatch, end), kept as the router keeps them
        self.last_end = 0.0          # when the last request ended (answered or failed): timers may run on past it
        self.answer_timing = False   # answers carry their timings (usage["warmpath"]["timing"]), as vLLM workers' do
        self.ledger = RequestLedger(self.decider, self.admission, self.sessions,
                                    lambda: [w.capacity() for w in self.workers.values()])
        self.ledger.fit()   # the fleet's limit (unless fixed)
        self.net, self.handoff = net_latency_s + handoff.extra_s, handoff   # one P->D handoff's fixed cost
        self.overhead = request_overhead_s   # router + HTTP time a request spends outside workers
        self.retokenize_miss = retokenize_miss   # share of answers the client sends back as other ids
        self.transfer_cpu = transfer_cpu   # shared cores: the store's side of a transfer keeps this many busy
        # the CPU profile: workers (and the store's process) share this many cores
        self.cpu = SharedCores(cpu_cores, self._at, contention) if cpu_cores else None
        self.client = SimClient(max_concurrency, namespace.block_size, self._at, timeout_s)   # TTFT from send if capped
        self.stats = SimStats()
        self.records: list[Record] = []
        self._heap: list = []
        self._tie = itertools.count()
        self._by_seq: dict[str, Req] = {}
        self._queued: dict[str, Req] = {}
        self._held: dict[str, Req] = {}   # admitted, held by the policy (``Decision.hold_s``)
        self._hop: dict[str, dict[str, tuple[int, int]]] = {}   # worker -> on the hop there: (new, all tokens)
        self._history: dict[str, list[int]] = {}
        self._hashes: dict[str, list[bytes]] = {}    # session -> block hashes of its history
        self.bound = LoadBook()   # handoffs bound for each decode worker, as the router's book keeps them
        self.now = 0.0
        self.stopped = False

    # -- event queue ---------------------------------------------------------
    def _at(self, t: float, fn, *args) -> None:
        heapq.heappush(self._heap, (t, next(self._tie), fn, args))

    def run(self, sessions: list[Session], stop=None, every: int = 512) -> list[Record]:
        """Every event; ``stop(records)``, asked every ``every`` events, ends the run early
        (``self.stopped``: e.g. once an SLO can no longer be met)."""
        for s in sessions:
            self._history[s.sid] = list(s.prefix)
            self._at(s.start, self._arrive, s, 0)
        while self._heap:
            self.now, _, fn, args = heapq.heappop(self._heap)
            self.stats.events += 1
            fn(*args)
            if stop is not None and self.stats.events % every == 0 and stop(self.records):
                self.stopped = True
                break
        return self.records

    # -- client and router -----------------------------------------------------
    def _arrive(self, s: Session, i: int) -> None:
        self.client.arrive(self.now, self._turn, s, i)

    def _turn(self, s: Session, i: int, ready: float | None = None) -> None:
        """Turn ``i`` sent now (it was ready at ``ready``)."""
        t = s.turns[i]
        hist = self._history[s.sid]
        hist += t.new_tokens
        sess = self.sessions.touch(s.sid, self.now)
        # the previous turn's blocks are a prefix of this one's: hash only what is new
        hashes = hash_prefix_blocks(self.ns, hist, self._hashes.pop(s.sid, ()))
        rv = self.decider.request_view(len(hist), tuple(hashes), self.ns.block_size, s.sid, sess, t.max_tokens,
                                       tenant=s.tenant, priority=s.priority)
        req = Req(f"{s.sid}-t{i}", s, i, list(hist), self.now, rv,
                  overlap=self.client.observe(hashes, len(hist), i + 1 if i else None),
                  client_wait=0.0 if ready is None else self.now - ready)
        self.client.watch(self.now, req, self._abandon)
        try:
            d = self._decide_route(req)
        except LookupError as e:
            return self._fail(req, f"no worker: {e}")
        verdict = self.ledger.admit(req.rid, rv, d, self.now)
        if verdict in ("rejected", "limited"):
            self.stats.rejected += 1
            return self._fail(req, "HTTP 429")
        if verdict == "queued":
            self._queued[req.rid] = req
            return
        self._dispatch(req, d)

    def _decide_route(self, req: Req, arrival: bool = True) -> Decision:
        """The router's route decision (``routing/route.py``) over the workers' state now."""
        if self.now >= self._next_rebalance:   # the router's once-a-second elastic pass
            self._next_rebalance = self.now + 1.0
            ch = self.decider.rebalance([w.view() for w in self.workers.values()], self.now,
                                        lambda v: self.workers[v.worker_id].decoding(),
                                        self.admission.waiting(), self.admission.current.slots)
            if ch is not None:
                self.workers[ch.worker].set_role(ch.new)
                self.stats.role_changes.append((ch.at, ch.worker, ch.new))
        sess = self.sessions.sessions.get(req.session.sid)
        views = [self._routed_view(wid, w.view()) for wid, w in self.workers.items()]
        snap = self.decider.snapshot(views,
                                     lambda w: self.index.lookup(w, req.rv.block_hashes, self.now),
                                     sess.decode_worker if sess else None, self.kvb, self.now)
        return self.decider.decide_route(req.rv, snap, arrival=arrival)

    def _routed_view(self, wid: str, v: WorkerView) -> WorkerView:
        """``v`` with what the router has sent ``wid`` that has not reached it: handoffs bound
        there (their prompts computing elsewhere), and requests on the router's hop to it (as
        running, prefilling their uncached tokens: the real router books them at once)."""
        hop = self._hop.get(wid)
        if hop:
            new, ctx = sum(n for n, _ in hop.values()), sum(c for _, c in hop.values())
            v = replace(v, queued_prefill_tokens=v.queued_prefill_tokens + new, running=v.running + len(hop),
                        running_tokens=v.running_tokens + ctx,
                        prefilling=v.prefilling + sum(1 for n, _ in hop.values() if n > 0))
        return replace(v, incoming=self.bound.incoming(wid, self.now)) if wid in self.bound.bound else v

    def _dispatch(self, req: Req, d: Decision) -> None:
        if d.hold_s > 0:   # held by the policy: decided again after the hold, as router/flow.py does
            req.held_at = self.now if req.held_at is None else req.held_at
            self._held[req.rid] = req
            self._at(self.now + d.hold_s, self._unhold, req)
            return
        self._held.pop(req.rid, None)
        req.decision, req.admitted = d, self.now
        req.worker_priority = self.admission.worker_priority(req.rv.tenant, req.rv.priority)
        if d.ppd == "local":
            self.stats.ppd_local += 1
        elif d.ppd == "remote":
            self.stats.ppd_remote += 1
        self.ledger.dispatched(self.sessions.touch(req.session.sid, self.now))
        for w in {d.prefill, d.decode} - {None}:
            self.stats.routed[w] = self.stats.routed.get(w, 0) + 1
        if d.prefill not in (None, d.decode):
            params = SamplingParams(1, 0.0, ignore_eos=True, priority=req.worker_priority)
            seq = Sequence(req.rid + "/p", req.prompt, params, self.ns, arrival_time=self.now)
            self.bound.expect(d.decode, req.rid, self.now + d.est_ttft_s, d.est_handoff_load_s)
            req.kv_hashes = self.handoff.kv_hashes(req.rid, req.turn, req.rv.block_hashes)
            seq.block_hashes = list(req.kv_hashes or req.rv.block_hashes)
            self._submit(d.prefill, seq, req)
        elif self.overhead:   # the router's hop to the worker that computes it all (on the router's book meanwhile)
            self._hop.setdefault(d.decode, {})[req.rid] = (len(req.prompt) - d.cached_tokens, len(req.prompt))
            self._at(self.now + self.overhead, self._submit, d.decode, self._decode_seq(req), req)
        else:
            self._submit(d.decode, self._decode_seq(req), req)

    def _unhold(self, req: Req) -> None:
        """A held request's hold ended: decided again, knowing how long it has been held."""
        if req.ended:   # abandoned meanwhile (its slot freed there)
            return
        req.rv = self.ledger.held(req.rv, req.held_at, self.now)
        try:
            d = self._decide_route(req, arrival=False)
        except LookupError as e:
            self._held.pop(req.rid, None)
            self._fail(req, f"no worker: {e}")
            return self._release(tenant=req.rv.tenant)
        self._dispatch(req, d)

    def _decode_seq(self, req: Req) -> Sequence:
        t = req.session.turns[req.turn]
        params = SamplingParams(t.max_tokens, 0.0, ignore_eos=True, priority=req.worker_priority)
        seq = Sequence(req.rid, req.prompt, params, self.ns, arrival_time=self.now)
        seq.block_hashes = list(req.kv_hashes or req.rv.block_hashes)   # the prompt's hashes, known already
        return seq

    def _submit(self, wid: str, seq: Sequence, req: Req) -> None:
        self._hop.get(wid, {}).pop(req.rid, None)
        if req.ended:   # abandoned on its way here
            return
        self._by_seq[seq.request_id] = req
        if not seq.request_id.endswith("/p"):
            req.at_worker = self.now
        self.workers[wid].add(seq)
        self._kick(wid)

    # -- workers ---------------------------------------------------------------
    def _kick(self, wid: str) -> None:
        """Start a step once everything arriving at this instant has arrived."""
        w = self.workers[wid]
        if not w.busy:
            w.busy = True
            self._at(self.now, self._start, wid)

    def _start(self, wid: str) -> None:
        w = self.workers[wid]
        got = w.start_step(self.now)
        w.busy = False
        landing = w.mover.next_landing()
        if landing is not None and got is None:   # only overlapped loads: wake when one lands
            self._at(landing, self._kick, wid)
        if got is not None:
            dt, out = got
            w.busy = True
            if self.cpu is None:
                self._at(self.now + dt, self._step_end, wid, out)
            else:   # its KV loads (with the store's process serving them), then its compute
                load = w.last_load_s
                self.cpu.run(self.now, wid, [(load, 1.0 + self.transfer_cpu), (dt - load, 1.0)],
                             lambda: self._step_end(wid, out))

    def _step_end(self, wid: str, out) -> None:
        w = self.workers[wid]
        got, finished, put_s = w.end_step(self.now, out)
        done = {s.request_id for s in finished}
        firsts = []
        batch = len(got)
        for seq in got:
            req = self._by_seq.get(seq.request_id)
            if req is None:                           # abandoned: its worker aborts it
                continue
            if seq.request_id.endswith("/p"):         # prefill side: first token once written through
                firsts.append((req, seq))
            else:
                self._decode_token(req, seq, seq.request_id in done, batch)
        if put_s <= 0:
            self._resume(wid, firsts)
        elif self.cpu is None:   # write-through puts run on the engine thread after the step
            self._at(self.now + put_s, self._resume, wid, firsts)
        else:
            self.cpu.run(self.now, wid, [(put_s, 1.0 + self.transfer_cpu)], lambda: self._resume(wid, firsts))

    def _resume(self, wid: str, firsts: list) -> None:
        self.workers[wid].busy = False
        for req, seq in firsts:
            if not req.ended:
                self._prefill_done(req, seq)
        self._kick(wid)

    def _prefill_done(self, req: Req, seq: Sequence) -> None:
        del self._by_seq[seq.request_id]
        self.bound.landed(req.decision.decode, req.rid)
        self._hop.setdefault(req.decision.decode, {})[req.rid] = (0, len(req.prompt))   # decodes there next
        started = self.workers[req.decision.prefill].first_scheduled.get(seq.request_id, self.now)
        self.workers[req.decision.prefill].forget(seq.request_id)
        at = self.now + self.net + self.overhead
        req.first_at = at if self.handoff.first_token == "prefill" else None   # else the decode worker's
        req.cached, req.cached_by_tier = max(0, seq.num_cached_tokens), dict(seq.cached_by_tier)
        req.output = [seq.output_token_ids[-1]]
        bs, worker = self.ns.block_size, req.decision.prefill
        written = seq.l3_written_blocks * bs * self.kvb   # what the prefill worker's tiers stored
        self.stats.handoff_bytes += written
        arrived = seq.arrival_time
        self.decider.observe_prefill(PrefillObservation(
            worker, len(req.prompt), req.cached, seq.cached_by_tier["L3"],
            started - arrived, self.now - arrived, 0.0, 0.0, written,
            at - arrived), self.workers[worker].view())
        self._at(at, self._handoff, req)

    def _handoff(self, req: Req) -> None:
        self._hop.get(req.decision.decode, {}).pop(req.rid, None)
        if req.ended:
            return
        seq = self._decode_seq(req)
        seq.output_token_ids.extend(req.output)
        if seq.params.max_tokens <= 1:
            req.first_at = self.now if req.first_at is None else req.first_at
            return self._finish(req)
        self._submit(req.decision.decode, seq, req)

    def _decode_token(self, req: Req, seq: Sequence, finished: bool, batch: int = 1) -> None:
        if req.dec_first is None:
            req.dec_first = self.now
        else:   # its answer's timing, as a worker reports it: steps after its first token and their batches
            req.dec_tokens += 1
            req.dec_batch += batch
        if req.first_at is None:
            req.first_at = self.now
            if not req.output:   # computed here from the start, not handed off
                req.cached, req.cached_by_tier = max(0, seq.num_cached_tokens), dict(seq.cached_by_tier)
        if finished:
            req.output = list(seq.output_token_ids)
            req.hashes = seq.full_block_hashes()
            del self._by_seq[seq.request_id]
            self.workers[req.decision.decode].forget(seq.request_id)
            self._finish(req)
