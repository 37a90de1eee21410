"""How a request ends in a simulation (pure): answered (the route decider's feedback, the session's
next turn), failed, or abandoned when its client gave up (``--timeout``) — each as the real
cluster ends it. The slot it held goes to the longest queued request, planned then (as
``router/flow.py``'s admission wakes a waiter); an abandoned request is dropped from the
admission queue, or its slot freed and its sequences aborted by their workers (a real worker
aborts a request whose client disconnected)."""

from __future__ import annotations

import random

from warmpath.sim.client import Req
from warmpath.routing.tenants import DEFAULT_TENANT


class Endings:
    """Mixed into :class:`~warmpath.sim.simulation.Simulation`, which owns the state used here
    (``client``, ``ledger``, ``sessions``, ``_queued``, ``_held``, ``_by_seq``, ``bound``,
    ``workers``, histories) and the plan / dispatch / kick steps."""

    def _finish(self, req: Req) -> None:
        s = req.session
        self.records.append(self.client.ended(self.now, req))
        self.last_end = self.now
        n = len(req.output)
        end = self.ledger.ended(req.decision, len(req.prompt), n, req.first_at - req.admitted,
                                (self.now - req.first_at) / (n - 1) if n > 1 else None,
                                self.sessions.touch(s.sid, self.now), req.rv.tenant)
        d = req.decision
        usage = {"warmpath": {"timing": self._timing(req)}} if self.answer_timing else None
        self.ledger.answered(d.decode, usage, self.workers[d.decode].view(), computed_here=d.prefill in (None, d.decode))
        answer = req.output
        if self.retokenize_miss and random.Random(req.rid).random() < self.retokenize_miss:
            # the client re-tokenized the answer's text into other ids: the next turn cannot
            # reuse its KV (ids 40000+ never come out of the simulated sampler)
            answer, req.hashes = [40000 + t % 9000 for t in answer], None
        self._history[s.sid] = req.prompt + answer
        if req.hashes:
            self._hashes[s.sid] = req.hashes
        self._start_waiting(end.woken)
        if req.turn + 1 < len(s.turns):
            self._arrive(s, req.turn + 1)
        else:
            self._history.pop(s.sid, None)
            self._hashes.pop(s.sid, None)

    def _timing(self, req: Req) -> dict:
        """What the answering worker reports of it (``AnswerTiming``), as a vLLM worker's relay
        does (``vllm/relay.py``): its first token from its arrival there (the queue inside it),
        then its tokens after the first over the steps between and their mean batch."""
        n = req.dec_tokens
        return {"computed_tokens": len(req.prompt) - req.cached, "cached_tokens": req.cached,
                "prefill_s": max(0.0, (req.dec_first or self.now) - req.at_worker), "queue_s": 0.0,
                "decode_s": self.now - req.dec_first if n and req.dec_first is not None else 0.0,
                "decode_steps": n, "batch": max(1.0, req.dec_batch / n) if n else 1.0}

    def _fail(self, req: Req, why: str) -> None:
        self.records.append(self.client.ended(self.now, req, why))
        self.last_end = self.now

    def _abandon(self, req: Req) -> None:
        """The client's timeout passed: it records a failure (as ``warmpath bench``); the router
        drops the request from its queue or frees its slot, the workers abort its sequences."""
        self._fail(req, f"TimeoutError: no answer within {self.client.timeout_s:g} s")
        if self._queued.pop(req.rid, None) is not None:
            self.ledger.abandoned_waiting(req.rid)
            return
        if self._held.pop(req.rid, None) is not None:   # admitted, held by the policy: nothing sent yet
            return self._release(tenant=req.rv.tenant)
        d = req.decision
        self.bound.landed(d.decode, req.rid)
        for sid, wid in ((req.rid + "/p", d.prefill), (req.rid, d.decode)):
            if self._by_seq.pop(sid, None) is not None:
                self.workers[wid].abort(sid)
                self._kick(wid)
        self._release(tenant=req.rv.tenant)

    def _release(self, kv_tokens: int | None = None, tenant: str = DEFAULT_TENANT) -> None:
        """A request's (``tenant``'s) in-flight slot goes to the next queued one (planned now);
        a request that ran to its end (``kv_tokens``: prompt + answer) may re-size the fleet's limit."""
        self._start_waiting(self.ledger.release(kv_tokens, tenant))

    def _start_waiting(self, keys: list) -> None:
        """Admission gave these waiters a slot: plan and dispatch each (a waiter with no
        worker fails and hands its slot on)."""
        keys = [k for k in keys if k is not None]
        while keys:
            q = self._queued.pop(keys.pop(0))
            try:
                self._dispatch(q, self._decide_route(q, arrival=False))
            except LookupError as e:
                self._fail(q, f"no worker: {e}")
                keys += self.ledger.release(tenant=q.rv.tenant)

