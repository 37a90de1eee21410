"""Which address a worker announces, and `warmpath store` as a real process."""

import argparse
import os
import signal
import subprocess
import sys

from warmpath.cli import advertise_host
from warmpath.launch.netaddr import is_wildcard, peer_host, route_source, url_host


def ns(**kw):
    base = dict(host="127.0.0.1", advertise_host=None, router=None, kv_store=None)
    return argparse.Namespace(**{**base, **kw})


def test_addresses():
    assert is_wildcard("0.0.0.0") and is_wildcard("::") and not is_wildcard("10.0.0.1")
    assert peer_host("http://10.1.2.3:8000/x") == "10.1.2.3"
    assert peer_host("10.1.2.3:50051,http://10.1.2.3:8080/metadata") == "10.1.2.3"
    assert route_source("http://127.0.0.1:8000") == "127.0.0.1"
    assert url_host("::1") == "[::1]" and url_host("10.0.0.1") == "10.0.0.1" and url_host("h") == "h"


def test_advertise_host_rules():
    assert advertise_host(ns(advertise_host="10.9.9.9", host="0.0.0.0")) == "10.9.9.9"
    assert advertise_host(ns(host="10.0.0.5")) == "10.0.0.5"
    # a wildcard bind announces the source address of the route to the router, never 0.0.0.0
    assert advertise_host(ns(host="0.0.0.0", router="http://127.0.0.1:8000")) == "127.0.0.1"
    assert advertise_host(ns(host="0.0.0.0")) == "127.0.0.1"


def test_store_segment_joins_an_existing_master(mooncake):
    p = subprocess.Popen([sys.executable, "-m", "warmpath.cli", "--log-level", "warning", "store", "--no-master",
                          "--kv-store", f"{mooncake.master},{mooncake.metadata}", "--host", "127.0.0.1",
                          "--segment-gib", "0.1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "MC_LOG_LEVEL": "ERROR"}, start_new_session=True)
    try:
        first = p.stdout.readline()
        assert first.startswith("warmpath store: segment on 127.0.0.1 (0.1 GiB lent)"), first
        assert f"--kv-store {mooncake.master},{mooncake.metadata}" in p.stdout.readline()
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=20) == 0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    bad = subprocess.run([sys.executable, "-m", "warmpath.cli", "store", "--host", "0.0.0.0"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "not a wildcard" in bad.stderr
