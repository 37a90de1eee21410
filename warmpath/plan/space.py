"""The topologies ``warmpath plan`` tries for a GPU budget (pure, no torch).

A candidate is a deployment: replicas, a PD split (``xPyD``, optionally with a PPD mode) or a
CPD split (pre-prefill + prefill + decode), and the tensor-parallel degree of each role's
instances. Pre-prefill and prefill instances share one TP: the elastic CPD tiers move
workers between those two roles (``routing/elastic.py``), so they must be alike. PPD modes
apply to PD splits (``ppd_kinds`` adds CPD: ``cpd-1d@dynamic``), and a PD split may also run
under another PD routing policy (``pd_policies``: ``pd-kv``, the KV-aware pool).
"""

from __future__ import annotations

from dataclasses import dataclass

from warmpath.launch.topology import Topology

KINDS = ("replica", "pd", "cpd")
PLAN_PPD_MODES = ("off", "x1", "dynamic")
PD_POLICIES = ("pd", "pd-kv")
_ROLES = {"replica": ("replica",), "pd": ("prefill", "decode"), "cpd": ("pre-prefill", "prefill", "decode")}
_SHORT = {"replica": "r", "pre-prefill": "pp", "prefill": "p", "decode": "d"}


@dataclass(frozen=True)
class Candidate:
    """``counts`` and ``tps``: instances and GPUs per instance, in the order of the kind's roles;
    ``policy``: the routing policy (default: the kind's own, e.g. ``pd-kv`` on a PD split)."""

    kind: str
    counts: tuple[int, ...]
    tps: tuple[int, ...]
    ppd: str = "off"
    policy: str = ""

    @property
    def roles(self) -> tuple[str, ...]:
        return _ROLES[self.kind]

    @property
    def gpus(self) -> int:
        return sum(n * t for n, t in zip(self.counts, self.tps))

    @property
    def tp(self) -> dict[str, int]:
        """GPUs per instance by role (``SimSetup.tp``)."""
        return dict(zip(self.roles, self.tps))

    @property
    def name(self) -> str:
        """E.g. ``replica 4r tp2``, ``pd 2p+6d tp1``, ``cpd 1pp+1p+2d tp4/1``, ``pd 1p+3d tp1 ppd-x1``,
        ``pd 2p+1d tp1 pd-kv``."""
        split = "+".join(f"{n}{_SHORT[r]}" for r, n in zip(self.roles, self.counts))
        tp = f"tp{self.tps[0]}" if len(set(self.tps)) == 1 else f"tp{self.tps[0]}/{self.tps[-1]}"
        pol = "" if self.policy in ("", self.kind) else f" {self.policy}"
        return f"{self.kind} {split} {tp}{pol}" + ("" if self.ppd == "off" else f" ppd-{self.ppd}")

    def topology(self) -> Topology:
        """The simulator's (and ``warmpath serve``'s) topology: roles, policy, PPD mode."""
        return Topology(self.name, self.policy or self.kind, dict(zip(self.roles, self.counts)), self.ppd)


def _counts(weights: tuple[int, ...], lo: int, hi: int) -> list[tuple[int, ...]]:
    """Every ``(n1, .., nk)`` with each ``n >= 1`` and ``lo <= sum(n * w) <= hi``, in lexicographic order."""
    if not weights:
        return [()]
    rest = sum(weights[1:])
    out = []
    n = 1
    while weights[0] * n + rest <= hi:
        used = weights[0] * n
        out += [(n, *tail) for tail in _counts(weights[1:], max(0, lo - used), hi - used)]
        n += 1
    return [c for c in out if lo <= sum(n * w for n, w in zip(c, weights)) <= hi]


def candidates(gpus: int, tp_set: tuple[int, ...] = (1, 2, 4, 8), kinds: tuple[str, ...] = KINDS,
               ppd_modes: tuple[str, ...] = ("off",), min_gpus: int | None = None,
               fits=lambda tp: True, ppd_kinds: tuple[str, ...] = ("pd",),
               pd_policies: tuple[str, ...] = ("pd",)) -> list[Candidate]:
    """Every candidate using between ``min_gpus`` (default: all of them) and ``gpus`` GPUs,
    TP degrees from ``tp_set`` where ``fits(tp)`` (the model fits ``tp`` GPUs with room for
    KV), PPD modes on the kinds of ``ppd_kinds`` (PD and / or CPD splits), PD splits under each
    policy of ``pd_policies``; ordered by kind, TPs, counts, policy, PPD mode."""
    if set(ppd_kinds) - {"pd", "cpd"}:
        raise ValueError(f"PPD applies to pd and cpd splits, got {list(ppd_kinds)}")
    if not pd_policies or set(pd_policies) - set(PD_POLICIES):
        raise ValueError(f"PD policies must be among {', '.join(PD_POLICIES)}, got {list(pd_policies)}")
    lo = gpus if min_gpus is None else min_gpus
    tps = sorted(t for t in set(tp_set) if t <= gpus and fits(t))
    out = []
    for kind in kinds:
        if kind not in _ROLES:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        # pre-prefill and prefill share a TP (elastic tiers swap workers between them)
        shapes = [(t,) for t in tps] if kind == "replica" else (
            [(tp, td) for tp in tps for td in tps] if kind == "pd" else [(tp, tp, td) for tp in tps for td in tps])
        for shape in shapes:
            for counts in _counts(shape, lo, gpus):
                for pol in (pd_policies if kind == "pd" else (kind,)):
                    for mode in (ppd_modes if kind in ppd_kinds else ("off",)):
                        out.append(Candidate(kind, counts, shape, mode, "" if pol == kind else pol))
    return out
