"""The routing flags (routing/flags.py): one definition, the same defaults everywhere, and a
serve's routing flags reach its router unchanged."""

import argparse

import pytest

from warmpath.routing.flags import add_routing_args, make_policy, routing_argv
from warmpath.routing.goodput import HOLD_SHARE, SLACK_SHARE
from warmpath.routing.policy import CPDPolicy, GoodputPolicy, ReplicaPolicy

FLAGS = ["--slo", "warm.ttft_p90=1,tpot_p90=0.05", "--goodput-local", "off", "--goodput-slack-share", "0.8",
         "--goodput-hold-share", "0.25", "--elastic", "roles", "--elastic-hold-s", "2.5", "--elastic-cooldown-s", "7.0",
         "--max-in-flight", "12", "--cold-queue", "3", "--warm-queue", "9"]
KEYS = ("slo", "goodput_local", "goodput_slack_share", "goodput_hold_share", "elastic", "elastic_hold_s",
        "elastic_cooldown_s", "max_in_flight", "cold_queue", "warm_queue")


def parser(**kw) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_routing_args(p, **kw)
    return p


def test_the_defaults_are_the_same_for_every_command():
    a = parser().parse_args([])
    assert (a.route_policy, a.ppd, a.slo, a.goodput_local, a.elastic, a.max_in_flight) == (
        None, None, None, "on", "auto", None)
    assert (a.goodput_slack_share, a.goodput_hold_share) == (SLACK_SHARE, HOLD_SHARE) == (0.5, 0.75)
    plan = parser(topology=False, slo_required=True).parse_args(["--slo", "ttft_p90=2"])
    assert not hasattr(plan, "route_policy") and plan.goodput_slack_share == a.goodput_slack_share


def test_a_serves_routing_flags_reach_its_router_unchanged():
    served = parser().parse_args(FLAGS)
    routed = parser().parse_args(routing_argv(served))
    assert [getattr(routed, k) for k in KEYS] == [getattr(served, k) for k in KEYS]
    assert [getattr(routed, k) for k in KEYS] == ["warm.ttft_p90=1,tpot_p90=0.05", "off", 0.8, 0.25, "roles", 2.5,
                                                  7.0, 12, 3, 9]


def test_make_policy_builds_what_the_flags_name():
    assert type(make_policy("cpd")) is CPDPolicy and type(make_policy("replica")) is ReplicaPolicy
    g = make_policy("goodput", local=False, slack_share=0.8, hold_share=0.25)
    assert type(g) is GoodputPolicy and (g.cfg.local, g.cfg.slack_share, g.cfg.hold_share) == (False, 0.8, 0.25)
    with pytest.raises(ValueError, match="unknown routing policy 'nope'"):
        make_policy("nope")
