"""The routing flags, defined once, and the policy and elastic rule they name.

``warmpath router``, ``serve``, ``sim`` and ``plan`` all take :func:`add_routing_args` (``plan``
without the flags it searches over: the policy and the PPD mode), with the same defaults;
:func:`make_policy` and :func:`elastic_from_args` build what they name, so the router and the
simulator run the same policy from the same command line. :func:`routing_argv` turns parsed
flags back into a router's command line (``serve`` starts its router with it).
"""

from __future__ import annotations

import argparse

from warmpath.routing.admission import AdmissionConfig
from warmpath.routing.elastic import MODES as ELASTIC_MODES
from warmpath.routing.elastic import ElasticConfig
from warmpath.routing.goodput import HOLD_SHARE, SLACK_SHARE, GoodputConfig
from warmpath.routing.policy import POLICIES, CPDConfig, CPDPolicy, GoodputPolicy, RoutingPolicy
from warmpath.routing.ppd import MODES as PPD_MODES
from warmpath.routing.tenants import TenantConfig, TenantLimit, split_keys
from warmpath.slo import CLUSTER_TARGET, Target

DEFAULT_POLICY = "replica"       # a router started alone, with no topology to take one from


def count_arg(minimum: int):
    """An argparse type: an integer >= ``minimum``."""
    def parse(v: str) -> int:
        try:
            x = int(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {v!r}") from None
        if x < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {v}")
        return x
    return parse


def _share(low_open: bool):
    def parse(s: str) -> float:
        try:
            x = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
        if not (0 < x <= 1 if low_open else 0 <= x <= 1):
            raise argparse.ArgumentTypeError(f"must be in {'(0, 1]' if low_open else '[0, 1]'}, got {s}")
        return x
    return parse


def add_routing_args(p: argparse.ArgumentParser, topology: bool = True, slo_required: bool = False) -> None:
    """The route decision's flags; ``topology``: also ``--route-policy`` and ``--ppd``
    (left out, the topology's own; a router alone: ``replica``, PPD off)."""
    g = p.add_argument_group("routing")
    if topology:
        g.add_argument("--route-policy", default=None, choices=tuple(POLICIES),
                       help=f"the routing policy (default: the topology's; a router alone: {DEFAULT_POLICY})")
        g.add_argument("--ppd", default=None, choices=PPD_MODES,
                       help="turn 2+ append-prefill on the session's decode worker (default: the topology's; "
                            "a router alone: off)")
    g.add_argument("--slo", default=None, required=slo_required,
                   help="the target (warmpath/slo.py syntax, e.g. warm.ttft_p90=2,cold.ttft_p90=20,tpot_p90=0.08) "
                        "that runs are judged by and the goodput policy keeps requests within "
                        f"(default {CLUSTER_TARGET.spec()})")
    g.add_argument("--goodput-local", default="on", choices=("on", "off"),
                   help="goodput policy: consider computing a prompt where it decodes (off: always hand off)")
    g.add_argument("--goodput-slack-share", type=_share(True), default=SLACK_SHARE,
                   help="goodput policy: the share of each request's TPOT slack (bound - unloaded TPOT) "
                        "a decision plans to use (1: pack up to the bound)")
    g.add_argument("--goodput-hold-share", type=_share(False), default=HOLD_SHARE,
                   help="goodput policy: hold a request whose decode batch would push it or the running "
                        "decodes past the TPOT bound while its held time + predicted TTFT stay within this "
                        "share of its TTFT bound (0: never hold)")
    g.add_argument("--elastic", default="auto", choices=ELASTIC_MODES,
                   help="workers change role as the mix drifts: on (between the CPD tiers) | roles (among "
                        "every role the policy routes to) | off (auto: on for the cpd policy)")
    g.add_argument("--elastic-hold-s", type=float, default=None,
                   help="elastic roles: seconds a role's pressure must hold before a change (default 5)")
    g.add_argument("--elastic-cooldown-s", type=float, default=None,
                   help="elastic roles: least seconds between two changes (default 20)")
    g.add_argument("--max-in-flight", type=count_arg(1), default=None,
                   help="router admission limit (default: what the workers can hold, re-sized as workers "
                        "join, leave or change role)")
    g.add_argument("--cold-queue", type=count_arg(0), default=None,
                   help="router wait queue for cold requests (default: 4/3 of the limit, at least 32)")
    g.add_argument("--warm-queue", type=count_arg(0), default=None,
                   help="router wait queue for warm requests (default: 8/3 of the limit, at least 64)")
    g.add_argument("--tenant-limit", action="append", default=None, metavar="TENANT:in_flight=N,tokens_s=R",
                   help="a tenant's limit (repeatable; TENANT * for every tenant without its own): past its tokens "
                        "per second (prompt + answer budget) a request gets 429 with Retry-After. Tenants come "
                        "from --api-key KEY=TENANT, or X-Tenant-Id on a router without API keys")


def target_of(a: argparse.Namespace) -> Target:
    """``--slo`` parsed (the cluster target when left out)."""
    return Target.parse(a.slo) if a.slo else CLUSTER_TARGET


def make_policy(name: str, target: Target | None = CLUSTER_TARGET, local: bool = True,
                slack_share: float = SLACK_SHARE, hold_share: float = HOLD_SHARE,
                cpd: CPDConfig = CPDConfig()) -> RoutingPolicy:
    """The routing policy ``name``: ``cpd`` with ``cpd``'s rule, ``goodput`` keeping requests
    within ``target``, the others as they are."""
    if name not in POLICIES:
        raise ValueError(f"unknown routing policy {name!r}; one of {', '.join(POLICIES)}")
    if name == "cpd":
        return CPDPolicy(cpd)
    if name == "goodput":
        return GoodputPolicy(GoodputConfig(target, local=local, slack_share=slack_share, hold_share=hold_share))
    return POLICIES[name]()


def policy_from_args(a: argparse.Namespace, name: str, cpd: CPDConfig = CPDConfig()) -> RoutingPolicy:
    """The policy ``name`` as the flags configure it."""
    return make_policy(name, target_of(a), a.goodput_local == "on", a.goodput_slack_share, a.goodput_hold_share, cpd)


def elastic_from_args(a: argparse.Namespace, name: str, policy: RoutingPolicy) -> ElasticConfig:
    """``--elastic`` (auto: on for ``cpd``) with its hysteresis flags, for ``policy``."""
    timing = {k: v for k, v in (("hold_s", a.elastic_hold_s), ("cooldown_s", a.elastic_cooldown_s)) if v is not None}
    return ElasticConfig.from_mode(a.elastic, name, policy.roles, policy.computes_anywhere, **timing)


def tenants_from_args(a: argparse.Namespace) -> TenantConfig:
    """``--api-key KEY=TENANT`` (or ``$WARMPATH_API_KEY``) and ``--tenant-limit``."""
    from warmpath.protocol.auth import api_key_specs

    _, keys = split_keys(api_key_specs(getattr(a, "api_key", None)))
    return TenantConfig(keys=keys, limits=dict(TenantLimit.parse(x) for x in a.tenant_limit or ()))


def admission_from_args(a: argparse.Namespace) -> AdmissionConfig:
    return AdmissionConfig.from_flags(a.max_in_flight, a.cold_queue, a.warm_queue)


def routing_argv(a: argparse.Namespace) -> list[str]:
    """The router command line that runs what ``a``'s routing flags say, but the policy and
    the PPD mode (``launch.launcher.start`` passes the topology's, which ``--route-policy`` and
    ``--ppd`` already chose)."""
    out = ["--goodput-local", a.goodput_local,
           "--goodput-slack-share", repr(a.goodput_slack_share), "--goodput-hold-share", repr(a.goodput_hold_share),
           "--elastic", a.elastic, *admission_from_args(a).to_argv()]
    if a.slo:
        out += ["--slo", a.slo]
    for x in a.tenant_limit or ():
        out += ["--tenant-limit", x]
    for flag in ("elastic_hold_s", "elastic_cooldown_s"):
        if getattr(a, flag) is not None:
            out += ["--" + flag.replace("_", "-"), repr(getattr(a, flag))]
    return out
