"""Every topology, started by the real launcher (Mooncake, router, workers as processes),
gives the text of one engine for the same greedy requests; PPD x=1 keeps turns 2+ local.

The requests and their checks: ``check_same_text`` (tests/launch/conftest.py). cpd-1d and
pd-2p1d answer them on the clusters test_cluster_behaviour.py starts for its other tests;
pd-2p2d is left out: its policy and PPD mode (pd, off) are pd-2p1d's, and its workers
(2 prefill, 2 decode) ppd-2p2d's."""

import pytest

from tests.conftest import cluster_process
from tests.launch.conftest import check_same_text


@pytest.mark.parametrize("topology, ppd", [
    ("replica", None), ("cpd-2d", None), ("ppd-1p3d", None), ("ppd-2p2d", "x0"), ("ppd-3p1d", "x1")])
def test_same_text_in_every_topology(topology, ppd, reference):
    args = ("--ppd", ppd) if ppd else ()
    with cluster_process(topology, *args) as base:
        check_same_text(base, reference, ppd, replica=topology == "replica")
