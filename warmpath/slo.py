"""The one definition of a service target: per-class bounds on TTFT, TPOT, ITL and E2E,
the share of requests that must attain them, and goodput (pure, no torch).

Every comparison — ``warmpath bench``, ``warmpath sim`` / ``bench --sim``, ``warmpath map``,
``warmpath plan``, ``repro`` and ``benchmarks/*.py`` — judges runs by a :class:`Target`.

* **Per request** (DistServe's attainment): a request *attains* when it succeeded and its
  own TTFT ≤ its TTFT bound, its own TPOT (``(E2E − TTFT) / (n − 1)``) ≤ its TPOT bound,
  its largest ITL ≤ ``itl`` and its E2E ≤ ``e2e``. A metric's bound is the tightest of its
  per-request key (``ttft``, ``tpot``) and its quantile keys at or above the share
  (``ttft_p90=2`` at share 0.9 bounds each request's TTFT at 2 s: "p90 ≤ 2 s" and "90% within
  2 s" are one statement); a request's bounds are its own class's (``cold`` / ``warm``,
  ``turn1`` / ``turn2+``; the tightest of those two) where given, else ``all``'s.
* **Per run** (:meth:`Target.met`): ≥ ``min_success`` of the requests succeed; in ``all``
  and every class the target names, the share of requests that attain (failures never do)
  is ≥ ``attain`` — default **0.90, DistServe's goodput share**; and each quantile key holds
  on its class's quantile (``ttft_p90``: TTFT p90; ``tpot_p90``: p90 of per-request TPOT;
  ``itl_p90``: p90 of the pooled inter-token latencies, only where streamed).
* **Goodput** (:func:`goodput`): the highest offered rate whose attainment meets the share
  with every lower rate's meeting it too (a pass above a miss is noise, not capacity).

CLI syntax (``--slo``): comma-separated ``[CLASS.]KEY=SECONDS`` plus ``attain=SHARE`` and
``success=SHARE``: ``ttft_p90=2,tpot=0.1`` (as before) or
``warm.ttft_p90=2,cold.ttft_p90=20,tpot_p90=0.05,attain=0.9``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Protocol

CLASSES = ("all", "cold", "warm", "turn1", "turn2+")
QUANTILES = (50, 90, 99)
METRICS = ("ttft", "tpot", "itl", "e2e")
KEYS = ("ttft", "ttft_p50", "ttft_p90", "ttft_p99", "tpot", "tpot_p50", "tpot_p90", "tpot_p99",
        "itl", "itl_p50", "itl_p90", "itl_p99", "e2e")
DEFAULT_ATTAIN = 0.90      # DistServe: goodput counts a rate when >= 90% of requests attain
DEFAULT_SUCCESS = 0.99


class Request(Protocol):
    """What a per-request check reads (``bench/metrics.Record``)."""

    ok: bool
    ttft: float | None
    e2e: float | None
    itls: list[float]

    @property
    def tpot(self) -> float | None: ...

    def classes(self) -> list[str]: ...


@dataclass(frozen=True)
class Bounds:
    """One class's limits in seconds (``None``: no limit). Keys without ``_pQQ`` bound each
    request; ``_pQQ`` keys bound the class's QQ-th percentile (and each request, when QQ is at
    or above the target's share)."""

    ttft: float | None = None
    ttft_p50: float | None = None
    ttft_p90: float | None = None
    ttft_p99: float | None = None
    tpot: float | None = None
    tpot_p50: float | None = None
    tpot_p90: float | None = None
    tpot_p99: float | None = None
    itl: float | None = None
    itl_p50: float | None = None
    itl_p90: float | None = None
    itl_p99: float | None = None
    e2e: float | None = None

    def __post_init__(self) -> None:
        for k, v in self.items():
            if not v > 0:
                raise ValueError(f"--slo: {k} must be > 0, got {v}")

    def items(self) -> list[tuple[str, float]]:
        """The keys set, in ``KEYS`` order."""
        return [(f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None]

    def per_request(self, metric: str, attain: float) -> float | None:
        """The bound on one request's ``metric``: the tightest of its per-request key and its
        quantile keys at or above ``attain``."""
        got = [getattr(self, metric)] if metric in ("ttft", "tpot", "itl", "e2e") else []
        got += [getattr(self, f"{metric}_p{q}", None) for q in QUANTILES if q / 100 >= attain - 1e-12]
        got = [x for x in got if x is not None]
        return min(got) if got else None


@dataclass(frozen=True)
class Target:
    """Per-class :class:`Bounds`, the attainment share and the success share (validated)."""

    classes: tuple[tuple[str, Bounds], ...] = ()
    attain: float = DEFAULT_ATTAIN
    min_success: float = DEFAULT_SUCCESS

    def __post_init__(self) -> None:
        names = [c for c, _ in self.classes]
        bad = [c for c in names if c not in CLASSES]
        if bad or len(set(names)) != len(names):
            raise ValueError(f"--slo: classes must be distinct, of {', '.join(CLASSES)}; got {names}")
        for k, v in (("attain", self.attain), ("success", self.min_success)):
            if not 0 < v <= 1:
                raise ValueError(f"--slo: {k} must be in (0, 1], got {v}")
        order = {c: i for i, c in enumerate(CLASSES)}
        object.__setattr__(self, "classes", tuple(sorted(self.classes, key=lambda p: order[p[0]])))

    # -- building ------------------------------------------------------------
    @classmethod
    def parse(cls, spec: str | None) -> "Target":
        """``[CLASS.]KEY=SECONDS,…,attain=SHARE,success=SHARE`` (empty: success alone)."""
        items = []
        for part in (spec or "").split(","):
            if part.strip():
                k, sep, v = part.partition("=")
                if not sep:
                    raise ValueError(f"--slo: expected KEY=SECONDS with KEY in {', '.join(KEYS)}, got {part!r}")
                items.append((k.strip(), v))
        return cls.from_items(items)

    @classmethod
    def from_items(cls, items) -> "Target":
        """From ``(key, value)`` pairs: the flat form (``{"ttft_p90": 2, "warm.ttft_p90": 2}``)."""
        per: dict[str, dict[str, float]] = {}
        shares = {}
        for k, v in items:
            try:
                v = float(v)
            except (TypeError, ValueError):
                raise ValueError(f"--slo: {k} must be a number, got {v!r}") from None
            if k in ("attain", "success"):
                shares[k] = v
                continue
            c, _, key = k.rpartition(".")
            c = c or "all"
            if key not in KEYS or c not in CLASSES:
                raise ValueError(f"--slo: expected KEY=SECONDS or CLASS.KEY=SECONDS with KEY in {', '.join(KEYS)} "
                                 f"and CLASS in {', '.join(CLASSES)}, got {k!r}")
            if key in per.setdefault(c, {}):
                raise ValueError(f"--slo: {k} given twice")
            per[c][key] = v
        return cls(tuple((c, Bounds(**b)) for c, b in per.items()),
                   shares.get("attain", DEFAULT_ATTAIN), shares.get("success", DEFAULT_SUCCESS))

    @classmethod
    def of(cls, x: "Target | dict | str | None") -> "Target":
        """A target from itself, its flat dict (the older ``slo`` dicts), its JSON or a spec."""
        if isinstance(x, Target):
            return x
        if isinstance(x, str) or x is None:
            return cls.parse(x)
        return cls.from_json(x) if "classes" in x else cls.from_items(x.items())

    def flat(self) -> dict[str, float]:
        """``{"ttft_p90": 2.0, "warm.ttft_p90": 2.0}``: the bounds as the ``--slo`` keys
        (``summary.json``'s ``slo``, unchanged for a spec without classes or shares)."""
        return {(k if c == "all" else f"{c}.{k}"): v for c, b in self.classes for k, v in b.items()}

    def spec(self) -> str:
        """The ``--slo`` string that parses back to this target."""
        parts = [f"{k}={v:g}" for k, v in self.flat().items()]
        parts += [f"attain={self.attain:g}"] * (self.attain != DEFAULT_ATTAIN)
        parts += [f"success={self.min_success:g}"] * (self.min_success != DEFAULT_SUCCESS)
        return ",".join(parts)

    def to_json(self) -> dict:
        """``{"attain", "min_success", "classes": {class: {key: seconds}}}``."""
        return {"attain": self.attain, "min_success": self.min_success,
                "classes": {c: dict(b.items()) for c, b in self.classes}}

    @classmethod
    def from_json(cls, d: dict) -> "Target":
        return cls(tuple((c, Bounds(**b)) for c, b in d.get("classes", {}).items()),
                   d.get("attain", DEFAULT_ATTAIN), d.get("min_success", DEFAULT_SUCCESS))

    # -- judging -------------------------------------------------------------
    def bounds(self, cls: str) -> Bounds | None:
        return dict(self.classes).get(cls)

    @property
    def empty(self) -> bool:
        """No bound at all: a run is judged on its success share alone."""
        return not self.classes

    def request_bound(self, classes: list[str], metric: str) -> float | None:
        """The bound on ``metric`` for a request of ``classes`` (``Record.classes()``): its own
        classes' tightest where they give one, else ``all``'s."""
        own = [b.per_request(metric, self.attain) for c in classes if c != "all" and (b := self.bounds(c))]
        own = [x for x in own if x is not None]
        if own:
            return min(own)
        b = self.bounds("all")
        return b.per_request(metric, self.attain) if b else None

    def attains(self, r: Request) -> bool:
        """Whether one request attains its bounds (a failed one never does)."""
        if not r.ok:
            return False
        cs = r.classes()
        vals = {"ttft": r.ttft, "tpot": r.tpot, "itl": max(r.itls) if r.itls else None, "e2e": r.e2e}
        for m in METRICS:
            lim = self.request_bound(cs, m)
            if lim is not None and vals[m] is not None and vals[m] > lim:
                return False
        return True

    def judged(self) -> list[str]:
        """Classes whose attainment share is checked: ``all`` and those named (none if empty)."""
        return [] if self.empty else ["all", *(c for c, _ in self.classes if c != "all")]

    def misses(self, summary: dict[str, dict]) -> list[str]:
        """What a run's per-class summary (``bench/metrics.summarize``) missed; [] = met."""
        a = summary["all"]
        if a["completed"] == 0:
            return ["no request completed"]
        out = [] if (a["success_rate"] or 0) >= self.min_success else [f"success {a['success_rate']:.3f}"]
        out += self.attainment_misses(summary)
        for c, b in self.classes:
            s = summary[c]
            for k, lim in b.items():
                if "_p" not in k or (c != "all" and s["completed"] == 0):
                    continue
                val = s.get(f"{k}_s")
                if val is None or val > lim:
                    out.append(f"{c} {k} {'none' if val is None else f'{val:.3g}'} > {lim:g}")
        return out

    def attainment_misses(self, summary: dict[str, dict]) -> list[str]:
        """Classes (with requests) whose attainment share is below ``attain``."""
        out = []
        for c in self.judged():
            share = summary[c].get("attainment")
            if share is not None and share < self.attain - 1e-12:
                out.append(f"{c} attainment {share:.3f} < {self.attain:g}")
        return out

    def met(self, summary: dict[str, dict]) -> bool:
        """The run-level check: success share, attainment shares and quantile bounds."""
        return not self.misses(summary)

    def attained(self, summary: dict[str, dict]) -> bool:
        """Goodput's check: every judged class's attainment share meets ``attain`` (failures
        count as misses) and something completed."""
        return summary["all"]["completed"] > 0 and not self.attainment_misses(summary)

    def headroom(self, summary: dict[str, dict]) -> float | None:
        """The tightest quantile bound over its limit (1 = at it; lower: more headroom); a
        per-request bound counts against its class's p90."""
        vals = []
        for c, b in self.classes:
            for k, lim in b.items():
                q = summary[c].get(f"{k}_s" if "_p" in k else f"{k}_p90_s")
                if q is not None:
                    vals.append(q / lim)
        return max(vals) if vals else None


def highest_met(runs: dict[float, dict], key: str) -> float | None:
    """The highest rate whose run has ``run[key]`` true with every lower rate's true too (a
    pass above a miss is noise, not capacity); ``None`` when the lowest missed."""
    best = None
    for r in sorted(runs):
        if not runs[r].get(key):
            break
        best = r
    return best


def goodput(runs: dict[float, dict]) -> dict:
    """The highest offered rate whose run ``attained`` (its attainment met the share) with
    every lower rate's too, beside what was achieved there: ``{"offered_rps", "achieved_rps",
    "attainment"}`` (``None`` when even the lowest rate missed)."""
    best = highest_met(runs, "attained")
    run = runs.get(best, {})
    return {"offered_rps": best, "achieved_rps": run.get("achieved_rps"),
            "attainment": run.get("attainment")}


# Stated before measuring (benchmarks/policies/real_policies.py, plan_vs_real, sim_policies): interactive (warm)
# requests start within 2 s and new documents within 20 s, at p90; 99% succeed.
CLUSTER_TARGET = Target.parse("warm.ttft_p90=2,cold.ttft_p90=20")
# warmpath repro cpd / warmpath map cpd (the CPD blog's): TTFT p90 <= 2 s, 99% succeed.
CPD_TARGET = Target.parse("ttft_p90=2")
