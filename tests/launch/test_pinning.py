"""Pinning workers to CPUs: the topology's ``cpus`` (file or ``--pin``) parsed and checked
against this machine, and a launched worker's affinity and ``--threads`` as it said (real
processes, the ``tiny`` model, no L3)."""

import json
import os

import pytest

from warmpath.launch import launcher
from warmpath.launch.topology import Topology, parse_cpus, pinning, resolve, with_pins
from warmpath.procs import free_port


def test_cpu_lists_parse():
    assert parse_cpus("0") == {0} and parse_cpus("0-2,5") == {0, 1, 2, 5} and parse_cpus([1, 3]) == {1, 3}
    assert parse_cpus(2) == {2}
    for bad in ("", "a", "3-1", "-1", "0,,x"):
        with pytest.raises(ValueError, match="expected CPU numbers|no CPU"):
            parse_cpus(bad)


def test_pinning_per_worker_over_role_and_checked_against_the_machine(tmp_path):
    t = Topology("t", "pd", {"prefill": 2, "decode": 1}, cpus={"prefill": "0-1", "prefill-1": "2", "router": "3"})
    assert pinning(t, available={0, 1, 2, 3}) == {"router": {3}, "prefill-0": {0, 1}, "prefill-1": {2}}
    with pytest.raises(ValueError, match=r"prefill-1 is pinned to CPU 2, not available here \(available: 0, 1, 3\)"):
        pinning(t, available={0, 1, 3})
    with pytest.raises(ValueError, match="cpus names 'decode-1', which is none of its processes"):
        Topology("t", "pd", {"prefill": 1, "decode": 1}, cpus={"decode-1": "0"})
    with pytest.raises(ValueError, match="cpus of decode: expected CPU numbers"):
        Topology("t", "pd", {"prefill": 1, "decode": 1}, cpus={"decode": "x"})
    f = tmp_path / "pinned.json"
    f.write_text(json.dumps({"policy": "pd", "workers": {"prefill": 1, "decode": 1},
                             "cpus": {"prefill-0": "0", "decode-0": "1"}}))
    t = resolve(str(f))
    assert t.cpus == {"prefill-0": "0", "decode-0": "1"}
    assert with_pins(t, ["decode-0=0", "router=1"]).cpus == {"prefill-0": "0", "decode-0": "0", "router": "1"}
    with pytest.raises(ValueError, match="--pin: expected NAME=CPUS"):
        with_pins(t, ["decode-0"])


def _allowed(pid: int) -> str:
    with open(f"/proc/{pid}/status") as f:
        return next(line.split(":", 1)[1].strip() for line in f if line.startswith("Cpus_allowed_list"))


def test_launched_workers_run_on_the_cpus_the_topology_names():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    a, b = cpus[0], cpus[1]
    topo = Topology("pinned", "replica", {"replica": 2}, cpus={"replica-0": str(a), "replica-1": f"{a},{b}"})
    with pytest.raises(ValueError, match="not available here"):
        launcher.start(Topology("bad", "replica", {"replica": 1}, cpus={"replica-0": "4095"}), "127.0.0.1",
                       free_port(), [], [], None, 0, None)
    c = launcher.start(topo, "127.0.0.1", free_port(), ["--model", "tiny", "--kv-cache-gib", "0.05"],
                       [], None, 0, None, timeout_s=120)   # the router: the embedded tokenizer
    try:
        r0, r1 = c.procs["replica-0"].pid, c.procs["replica-1"].pid
        assert os.sched_getaffinity(r0) == {a} and os.sched_getaffinity(r1) == {a, b}
        assert _allowed(r0) == str(a)
        # --threads: the pinned CPU count
        assert c.argv["replica-0"][c.argv["replica-0"].index("--threads") + 1] == "1"
        assert c.argv["replica-1"][c.argv["replica-1"].index("--threads") + 1] == "2"
        assert os.sched_getaffinity(c.procs["router"].pid) == os.sched_getaffinity(0)     # not pinned
    finally:
        c.stop()


def test_unpinned_vllm_workers_get_disjoint_cpus():
    """Each unpinned vLLM worker gets its own contiguous share of the CPUs no worker pin holds;
    the first ones get the remainder; a router pin is not a worker's; too few CPUs: unchanged."""
    from warmpath.launch.topology import spread_pins, spread_vllm

    t = Topology("t", "pd", {"prefill": 1, "decode": 1})
    assert spread_pins(t, ["prefill-0", "decode-0"], available={0, 1}).cpus == {"prefill-0": "0", "decode-0": "1"}
    assert spread_pins(t, ["prefill-0", "decode-0"], available={0, 1, 2, 3, 4}).cpus == \
        {"prefill-0": "0,1,2", "decode-0": "3,4"}
    pinned = Topology("t", "pd", {"prefill": 2, "decode": 1}, cpus={"prefill-1": "1", "router": "2"})
    assert spread_pins(pinned, ["prefill-0", "prefill-1", "decode-0"], available={0, 1, 2, 3}).cpus == \
        {"prefill-1": "1", "router": "2", "prefill-0": "0,2", "decode-0": "3"}
    three = Topology("t", "replica", {"replica": 3})
    assert spread_pins(three, ["replica-0", "replica-1", "replica-2"], available={0, 1}) is three
    assert spread_pins(t, [], available={0, 1}) is t
    # the launcher's rule: only the vLLM workers (per role, else the --engine default) are spread
    mixed = Topology("t", "pd", {"prefill": 1, "decode": 1}, engines={"decode": "vllm"})
    got = spread_pins(mixed, ["decode-0"], available={0, 1})
    assert got.cpus == {"decode-0": "0,1"}
    assert spread_vllm(Topology("t", "pd", {"prefill": 1, "decode": 1}), "warmpath").cpus == {}
