"""Elastic roles: a worker changes role among pre-prefill (cold tier), prefill (warm tier),
decode and replica when the mix of traffic drifts (pure; the caller passes the time and the
load). The router (``route.py``) and the simulator run this one rule.

**Pressure.** Each worker's load in units of its role's budget (1 = at the budget):

* pre-prefill / prefill: its predicted queue (seconds of queued prompt work, the router's
  learnt model) over ``cold_queue_s`` / ``warm_queue_s`` (with every role taking part, the
  goodput target's cold / warm TTFT bounds; else 1 s each, as the CPD tiers always had);
* decode: the largest of its KV use over ``kv_high``, its running requests' predicted TPOT
  over ``tpot_s`` (the goodput target's running-TPOT bound; no TPOT term without one) and its
  slots in use — the requests it holds plus its share of those waiting at the router's
  admission, over the slots admission counts for it (``admission.worker_slots``): requests
  waiting for room while the prompt tiers hold few mean the decoders are the fleet's limit;
* replica: the larger of the two (it computes prompts and decodes them).

A role's pressure is the mean over its workers (only the roles in ``roles`` take part).

**The rule, each pass.** A role is *pressed* when its pressure exceeds ``min_pressure`` and
``ratio`` × a donor's. A *donor* is another role with a worker to spare: more than one, or
any at all for a role the fleet did not start with (each role a worker started in keeps one) —
or, with ``spare_last`` (a policy that computes any prompt on a decode-type worker: the
``goodput`` decision with local paths), its last one too, as long as a worker that decodes
(decode or replica) is left: a 1P1D pair whose decode side is pressed becomes two workers that
both compute and decode, as replicas do.
The most pressed role (ties in ``ROLES`` order) takes the least-pressed worker of the least
pressed donor (under ``roles``, at equal pressure one not in the role it started in: a lent
worker goes back) — when the pressure has held ``hold_s`` without a break, ``cooldown_s`` has
passed since the last change and the last change has drained. The new role is the pressed
one, except that a pressed *decode* side becomes a **replica** when ``replica`` takes part
and the recent share of requests routed local (prompt and decode on one worker) is at least
``local_share``: the work arrives whole, so the worker takes it whole, without handoffs.

**Repaying a last worker.** A worker lent out of a role that has no worker left goes back to
it once every role would be calm without it — pressure at most ``min_pressure / ratio``, the
roles doing its work carrying it on one worker fewer — for ``hold_s`` (and ``cooldown_s`` has
passed): the fleet returns to the layout it started in when it no longer needs the loan, and
not when the loan is what keeps it calm.

**Draining.** The router routes by the new role at once (nothing of the old role's traffic
goes there any more); what the worker holds that the new role cannot serve — running
decodes when it leaves decode/replica for a prefill tier, queued prompts when it becomes a
decode worker — finishes there (KV it holds stays indexed). Until it has (or ``drain_s``
passed), no other change is made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from warmpath.routing.views import ROLES, WorkerView

TIERS = ("pre-prefill", "prefill")          # ``--elastic on``: the CPD tiers, as before
DECODES = ("decode", "replica")             # roles that decode
PROMPTS = ("pre-prefill", "prefill", "replica")   # roles given prompts to compute (decode: only local ones)
MODES = ("auto", "on", "roles", "off")


@dataclass(frozen=True)
class ElasticConfig:
    enabled: bool = True
    roles: tuple[str, ...] = TIERS          # the roles workers move among
    ratio: float = 2.0
    min_pressure: float = 1.0
    hold_s: float = 5.0
    cooldown_s: float = 20.0
    cold_queue_s: float | None = None       # a tier's queue counted as one unit (None: the policy's TTFT bound, else 1 s)
    warm_queue_s: float | None = None
    kv_high: float = 0.9                    # decode: KV use counted as one unit
    tpot_s: float | None = None             # decode: TPOT counted as one unit (None: the policy's bound, if any)
    local_share: float = 0.5                # a pressed decode side gets a replica at or above this local share
    drain_s: float = 120.0                  # a change counts as drained after this long regardless
    lent_first: bool = False                # at equal pressure a worker lent from another role goes back first
                                            # (``roles``; ``on`` keeps the CPD tiers' choice: the lowest id)
    spare_last: bool = False                # a started role's last worker may be lent (module docstring)

    def __post_init__(self) -> None:
        if self.ratio < 1 or min(self.min_pressure, self.hold_s, self.cooldown_s, self.drain_s) < 0:
            raise ValueError("elastic roles: need ratio >= 1 and non-negative thresholds and times")
        units = (self.cold_queue_s, self.warm_queue_s, self.tpot_s)
        if self.kv_high <= 0 or any(u is not None and u <= 0 for u in units):
            raise ValueError("elastic roles: queue, KV and TPOT units must be > 0")
        if not 0 <= self.local_share <= 1:
            raise ValueError(f"elastic roles: local_share must be in [0, 1], got {self.local_share}")
        bad = set(self.roles) - set(ROLES)
        if bad or len(self.roles) < 2:
            raise ValueError(f"elastic roles: need two or more of {ROLES}, got {self.roles}")

    @classmethod
    def from_mode(cls, mode: str, policy: str, policy_roles: tuple[str, ...] = ROLES, computes_anywhere: bool = False,
                  **kw) -> ElasticConfig:
        """``--elastic``: ``on`` (the CPD tiers), ``roles`` (every role the policy routes to),
        ``off``, ``auto`` (on for the ``cpd`` policy). ``computes_anywhere``: the policy computes
        any prompt on a decode-type worker (``RoutingPolicy.computes_anywhere``), so under
        ``roles`` a started role's last worker may be lent (``spare_last``)."""
        if mode not in MODES:
            raise ValueError(f"--elastic must be one of {MODES}, got {mode!r}")
        if mode == "auto":
            mode = "on" if policy == "cpd" else "off"
        roles = TIERS if mode in ("on", "off") else tuple(r for r in ROLES if r in policy_roles)
        return cls(enabled=mode != "off" and len(roles) >= 2, roles=roles if len(roles) >= 2 else TIERS,
                   lent_first=mode == "roles", spare_last=computes_anywhere and mode == "roles", **kw)


def with_policy_units(cfg: ElasticConfig, policy) -> ElasticConfig:
    """``cfg`` with the units it leaves to the policy taken from its target, where it has one
    (the goodput policy: its cold / warm TTFT bounds and its running-TPOT bound). Not for the
    CPD tiers alone (``--elastic on``): their queues stay in 1 s units, as they always were."""
    pc = getattr(policy, "cfg", None)
    if not hasattr(pc, "bound") or set(cfg.roles) <= set(TIERS):
        return cfg
    return replace(cfg, cold_queue_s=cfg.cold_queue_s or pc.bound(["cold"], "ttft"),
                   warm_queue_s=cfg.warm_queue_s or pc.bound(["warm"], "ttft"),
                   tpot_s=cfg.tpot_s or pc.running_tpot_bound())


@dataclass(frozen=True)
class Load:
    """What the rule reads of each worker beside its view: ``queue_s`` (predicted seconds of
    its queued prompts), ``tpot_s`` (its running requests' predicted TPOT), ``decoding``
    (requests decoding there), and the recent share of requests routed local."""

    queue_s: Callable[[WorkerView], float]
    tpot_s: Callable[[WorkerView], float] = lambda w: 0.0
    decoding: Callable[[WorkerView], int] = lambda w: w.running
    local_share: float = 0.0
    slots_used: Callable[[WorkerView], float] = lambda w: 0.0   # decode-type: share of its admission slots held


def slots_used(decoding: Callable[[WorkerView], int], views: list[WorkerView], waiting: int,
               slots: dict[str, int]) -> Callable[[WorkerView], float]:
    """A decode-type worker's slots in use: the requests it holds plus an equal share of the
    ``waiting`` ones (the router's admission queue) among the decode-type workers of ``views``,
    over its ``slots`` (``admission.FleetLimit.slots``); 0 where its slots are unknown."""
    share = waiting / max(1, sum(1 for v in views if v.role in DECODES))
    return lambda w: (decoding(w) + share) / slots[w.worker_id] if slots.get(w.worker_id) else 0.0


@dataclass(frozen=True)
class RoleChange:
    at: float
    worker: str
    old: str
    new: str
    reason: str


def pressure(cfg: ElasticConfig, w: WorkerView, load: Load) -> float:
    """``w``'s load in units of its role's budget (module docstring)."""
    warm = cfg.warm_queue_s or 1.0
    if w.role in TIERS:
        return load.queue_s(w) / (cfg.cold_queue_s or 1.0 if w.role == "pre-prefill" else warm)
    dec = max(w.kv_usage / cfg.kv_high, load.tpot_s(w) / cfg.tpot_s if cfg.tpot_s else 0.0, load.slots_used(w))
    return dec if w.role == "decode" else max(dec, load.queue_s(w) / warm)


def held(change: RoleChange, w: WorkerView, load: Load) -> int:
    """What ``w`` still holds of its old role that its new one cannot serve."""
    n = load.decoding(w) if change.old in DECODES and change.new not in DECODES else 0
    return n + (w.queued_prefill_tokens if change.old in PROMPTS and change.new not in PROMPTS else 0)


@dataclass
class Elastic:
    """Decides role changes; :meth:`step` once a second or so."""

    cfg: ElasticConfig = ElasticConfig()
    pressed_since: dict[str, float] = field(default_factory=dict)
    calm_since: dict[str, float] = field(default_factory=dict)   # lent last workers: since all is calm without them
    last_change: float = float("-inf")
    changes: list[RoleChange] = field(default_factory=list)
    started: dict[str, str] = field(default_factory=dict)       # worker -> the role it was first seen in
    draining: RoleChange | None = None                           # the last change, until drained
    drained: list[tuple[float, RoleChange]] = field(default_factory=list)

    def step(self, views: list[WorkerView], load: Load, now: float) -> RoleChange | None:
        """The change to apply now, if any (also kept in :attr:`changes`)."""
        if not self.cfg.enabled:
            return None
        for w in views:
            self.started.setdefault(w.worker_id, w.role)
        if not self._drained(views, load, now):
            return None
        by = {r: [w for w in views if w.role == r] for r in self.cfg.roles}
        p = {r: sum(pressure(self.cfg, w, load) for w in ws) / len(ws) if ws else 0.0 for r, ws in by.items()}
        over = lambda r, d: p[r] > max(self.cfg.min_pressure, self.cfg.ratio * p[d])
        pressed = sorted((r for r in p if by[r] and any(over(r, d) for d in p if d != r)),
                         key=lambda r: (-p[r], ROLES.index(r)))
        self.pressed_since = {r: self.pressed_since.get(r, now) for r in pressed}   # a break restarts a clock
        need = {self.started[w.worker_id] for w in views}
        for r in pressed:
            dest = self._dest(r, load)
            donors = [d for d in p if d not in (r, dest) and len(by[d]) > (d in need and not self._spare(d, dest, by))
                      and over(r, d)]
            since = self.pressed_since[r]
            if donors and now - since >= self.cfg.hold_s and now - self.last_change >= self.cfg.cooldown_s:
                return self._move(r, dest, min(donors, key=lambda d: (p[d], ROLES.index(d))), p, by, load, since, now)
        if pressed:
            self.calm_since = {}
            return None
        return self._repay(views, by, p, now)

    def _spare(self, donor: str, dest: str, by: dict) -> bool:
        """``spare_last``: the donor's last worker may go, a worker that decodes being left."""
        decoders = sum(len(by.get(x, ())) for x in DECODES) - (donor in DECODES) + (dest in DECODES)
        return self.cfg.spare_last and decoders >= 1

    def _repay(self, views: list[WorkerView], by: dict, p: dict, now: float) -> RoleChange | None:
        """A worker lent out of a role now empty goes back once every role would be calm
        without it (:meth:`_without`) for ``hold_s``."""
        calm = self.cfg.min_pressure / self.cfg.ratio
        owed = sorted((w for w in views if w.role in p and self.started[w.worker_id] in by
                       and not by[self.started[w.worker_id]]), key=lambda w: w.worker_id)
        self.calm_since = {w.worker_id: self.calm_since.get(w.worker_id, now) for w in owed
                           if self._without(w, by, p) <= calm}
        for w in owed:
            since = self.calm_since.get(w.worker_id)
            if since is not None and now - since >= self.cfg.hold_s and now - self.last_change >= self.cfg.cooldown_s:
                home = self.started[w.worker_id]
                ch = RoleChange(now, w.worker_id, w.role, home, f"repaid to {home} (its last worker): every role's "
                                f"pressure <= {calm:.2f} without it for {now - since:.0f}s")
                self.changes.append(ch)
                del self.changes[:-100]
                self.last_change, self.draining, self.pressed_since, self.calm_since = now, ch, {}, {}
                return ch
        return None

    @staticmethod
    def _without(w: WorkerView, by: dict, p: dict) -> float:
        """The highest role pressure once ``w`` leaves: the roles doing its work (every
        decode-type role, when it decodes) carry it on ``n − 1`` workers instead of ``n``
        (infinite when it is their only worker)."""
        family = DECODES if w.role in DECODES else (w.role,)
        n = sum(len(by.get(r, ())) for r in family)
        scale = n / (n - 1) if n > 1 else float("inf")
        return max((p[r] * (scale if r in family else 1.0) for r, ws in by.items() if ws), default=0.0)

    def _move(self, r: str, dest: str, donor: str, p: dict, by: dict, load: Load, since: float,
              now: float) -> RoleChange:
        # the least pressed; at equal pressure (lent_first) one lent from another role goes back first
        lent = (lambda x: self.started[x.worker_id] == x.role) if self.cfg.lent_first else (lambda x: False)
        w = min(by[donor], key=lambda x: (pressure(self.cfg, x, load), lent(x), x.worker_id))
        ch = RoleChange(now, w.worker_id, w.role, dest, f"{r} pressure {p[r]:.2f} vs {donor} {p[donor]:.2f} "
                        f"for {now - since:.0f}s; local share {load.local_share:.2f}")
        self.changes.append(ch)
        del self.changes[:-100]
        self.last_change, self.draining, self.pressed_since = now, ch, {}
        return ch

    def _dest(self, pressed: str, load: Load) -> str:
        if pressed == "decode" and "replica" in self.cfg.roles and load.local_share >= self.cfg.local_share:
            return "replica"
        return pressed

    def _drained(self, views: list[WorkerView], load: Load, now: float) -> bool:
        """``False`` while the last change's worker still holds its old role's work."""
        ch = self.draining
        if ch is None:
            return True
        w = next((v for v in views if v.worker_id == ch.worker), None)
        if w is not None and w.role == ch.new and held(ch, w, load) and now - ch.at < self.cfg.drain_s:
            return False
        self.draining = None
        self.drained.append((now, ch))
        del self.drained[:-100]
        return True


def elastic_json(e: Elastic) -> dict:
    """``/v1/cluster``'s ``elastic``: the settings, the last changes, the one draining."""
    return {"enabled": e.cfg.enabled, "roles": list(e.cfg.roles), "changes": [vars(c) for c in e.changes[-20:]],
            "draining": vars(e.draining) if e.draining else None,
            "drained": [{"at": t, "worker": c.worker, "new": c.new} for t, c in e.drained[-20:]]}
