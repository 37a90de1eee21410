"""A cluster over four "hosts": network namespaces on one bridge, each with its own address,
running exactly the commands of docs/deploy.md (store + router, pre-prefill, prefill, decode).

Needs root and iproute2 (CI runs as root); skipped with the reason otherwise. Every address
used lives in namespaces this test creates; the test's own requests run on a thread that
joined host A's namespace (setns), so nothing leaves them.
"""

import concurrent.futures as cf
import contextlib
import ctypes
import os
import random
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import metric, served_params, stop_group
from warmpath.engine.llm_engine import EngineConfig, LLMEngine

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="needs root and iproute2 to create network namespaces (ip netns); CI runs as root")

HOSTS = {"A": "10.77.0.1", "B": "10.77.0.2", "C": "10.77.0.3", "D": "10.77.0.4"}
NS = {h: f"wpt-{h.lower()}" for h in HOSTS}
BRIDGE_NS = "wpt-br"
ROUTER = "http://10.77.0.1:8000"
DEPLOY = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"
TEST_FLAGS = {"worker": ["--threads", "1", "--kv-cache-gib", "0.25", "--l2-gib", "0.25"],
              "store": ["--segment-gib", "0.5"], "router": []}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


def deploy_commands() -> list[tuple[str, list[str]]]:
    """The ``X$ warmpath ...`` lines of docs/deploy.md: (host, argv after ``warmpath``)."""
    lines = re.findall(r"^([A-D])\$ warmpath (.+)$", DEPLOY.read_text(), flags=re.M)
    assert len(lines) == 5, "docs/deploy.md must list the store, router and three workers"
    return [(h, cmd.split()) for h, cmd in lines]


@contextlib.contextmanager
def namespaces():
    """Four namespaces, each with one veth into a bridge that lives in a fifth namespace."""
    made = []
    try:
        for name in [BRIDGE_NS, *NS.values()]:
            sh("ip", "netns", "add", name)
            made.append(name)
        sh("ip", "-n", BRIDGE_NS, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", BRIDGE_NS, "link", "set", "br0", "up")
        for h, ns in NS.items():
            sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{h}", "netns", BRIDGE_NS)
            sh("ip", "-n", BRIDGE_NS, "link", "set", f"p{h}", "master", "br0")
            sh("ip", "-n", BRIDGE_NS, "link", "set", f"p{h}", "up")
            sh("ip", "-n", ns, "addr", "add", f"{HOSTS[h]}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield
    finally:
        for name in reversed(made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def enter_netns(name: str) -> None:
    """Move the calling thread into a network namespace (sockets it opens live there)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, 0x40000000) != 0:   # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), f"setns {name}")
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def reference(served_model):
    e = LLMEngine(EngineConfig(), loaded=served_model)
    tok = e.tokenizer
    ids = tok.encode(tok.apply_chat_template(QUESTION), add_special=False)
    return tok.decode(e.generate([ids], served_params(served_model, 16, temperature=0))[0], skip_special=True)


def start_deployment(procs: dict, tmp_path, env: dict, wait_for) -> None:
    """Run docs/deploy.md's commands, each on its host (namespace), logs in ``tmp_path``."""
    for host, argv in deploy_commands():
        name = argv[argv.index("--worker-id") + 1] if "--worker-id" in argv else argv[0]
        log = open(tmp_path / f"{name}.log", "w")
        procs[name] = subprocess.Popen(
            ["ip", "netns", "exec", NS[host], sys.executable, "-m", "warmpath.cli", "--log-level", "warning",
             *argv, *TEST_FLAGS[argv[0]]], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        if argv[0] == "store":   # the workers need the master up
            wait_for(lambda: "--kv-store" in (tmp_path / "store.log").read_text(), 60, "store up")


def test_a_cluster_across_four_hosts(reference, tmp_path):
    env = {**os.environ, "WARMPATH_CLUSTER_TOKEN": secrets.token_urlsafe(24), "MC_LOG_LEVEL": "ERROR"}
    auth = {"Authorization": f"Bearer {env['WARMPATH_CLUSTER_TOKEN']}"}
    procs: dict[str, subprocess.Popen] = {}
    inside = cf.ThreadPoolExecutor(1, initializer=enter_netns, initargs=(NS["A"],))

    def on_a(fn, *args, **kw):
        return inside.submit(fn, *args, **kw).result()

    def cluster() -> dict:
        return on_a(httpx.get, ROUTER + "/v1/cluster", headers=auth, timeout=5).json()

    def workers() -> dict:
        try:
            return {w["worker_id"]: w for w in cluster()["workers"]}
        except httpx.HTTPError:
            return {}

    def wait_for(pred, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if got := pred():
                return got
            for name, p in procs.items():
                assert p.poll() is None, f"{name} exited: {(tmp_path / (name + '.log')).read_text()[-3000:]}"
            time.sleep(0.2)
        raise AssertionError(f"{what}: not within {timeout} s")

    with namespaces():
        try:
            start_deployment(procs, tmp_path, env, wait_for)
            wait_for(lambda: len(workers()) == 3, 240, "three workers registered")
            assert on_a(httpx.get, ROUTER + "/ready").json()["status"] == "ready"

            # greedy answer identical to a single engine
            r = on_a(httpx.post, ROUTER + "/v1/chat/completions", timeout=120,
                     json={"messages": QUESTION, "max_tokens": 16, "temperature": 0})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == reference

            # a cold document: prefilled on B, handed to D through the store on A
            doc = [random.Random(3).randrange(1000, 40000) for _ in range(600)]
            body = {"prompt": doc, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
            r1 = on_a(httpx.post, ROUTER + "/v1/completions", json=body, timeout=120)
            assert r1.status_code == 200 and r1.headers["x-warmpath-worker"] == "pre-prefill-0"
            dec = workers()["decode-0"]["url"]
            assert dec == "http://10.77.0.4:8001"
            l3_read = on_a(metric, dec, "warmpath_kv_tier_read_bytes_total", tier="L3")
            assert l3_read and l3_read > 0                       # D loaded B's blocks from A's store

            # the second turn is served from cache (routed warm, its history loaded, not computed)
            time.sleep(1.5)
            r2 = on_a(httpx.post, ROUTER + "/v1/completions", timeout=120,
                      json={**body, "prompt": doc + [11, 12, 13]})
            assert r2.status_code == 200 and r2.headers["x-warmpath-route"] == "warm"
            assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 576

            # events crossed hosts: the router's index holds the blocks of every worker that computed
            # or loaded KV (the warm turn goes to whichever prefill-type worker is predicted faster)
            held = {"pre-prefill-0", "decode-0", r2.headers["x-warmpath-worker"]}
            wait_for(lambda: all(workers()[w]["indexed_blocks"] > 0 for w in held), 20, "blocks of those workers")

            # cut C's link mid-run: the router drops prefill-0 and keeps serving
            sh("ip", "-n", BRIDGE_NS, "link", "set", "pC", "down")
            warm = {**body, "prompt": doc + [21, 22, 23]}
            r3 = on_a(httpx.post, ROUTER + "/v1/completions", json=warm, timeout=120)
            assert r3.status_code == 200 and r3.headers["x-warmpath-worker"] == "pre-prefill-0"
            wait_for(lambda: "prefill-0" not in workers(), 10, "prefill-0 dropped")
            r4 = on_a(httpx.post, ROUTER + "/v1/chat/completions", timeout=120,
                      json={"messages": QUESTION, "max_tokens": 16, "temperature": 0})
            assert r4.status_code == 200 and r4.json()["choices"][0]["message"]["content"] == reference
        finally:
            inside.shutdown(wait=False)
            for p in procs.values():
                stop_group(p, 15)
