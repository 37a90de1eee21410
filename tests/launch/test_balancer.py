"""HAProxy in front of several routers (launch/balancer.py): its configuration, and a real
HAProxy that sends a request to the live backend when the other one has just died (before
its health check noticed)."""

import http.server
import shutil
import threading
import time

import httpx
import pytest

from tests.conftest import free_port
from warmpath.launch.balancer import Balancer, BalancerConfig, haproxy_config

needs_haproxy = pytest.mark.skipif(shutil.which("haproxy") is None and not shutil.os.path.exists("/usr/sbin/haproxy"),
                                   reason="HAProxy not installed (make setup-test installs it)")


def test_the_config_checks_ready_retries_on_connection_failures_and_names_every_router():
    text = haproxy_config(BalancerConfig("127.0.0.1", 8000, (("router-0", "127.0.0.1:9001"),
                                                              ("router-1", "127.0.0.1:9002"))))
    lines = [ln.strip() for ln in text.splitlines()]
    assert "bind 127.0.0.1:8000" in lines
    assert "option httpchk GET /ready" in lines and "http-check expect status 200" in lines
    assert "retry-on conn-failure empty-response junk-response" in lines and "option redispatch 1" in lines
    assert "retries 3" in lines and "tune.bufsize 262144" in lines
    assert lines[-2:] == ["server router-0 127.0.0.1:9001 check", "server router-1 127.0.0.1:9002 check"]
    with pytest.raises(ValueError, match="at least one router"):
        BalancerConfig("127.0.0.1", 8000, ())


class Named(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self._answer()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer()

    def _answer(self):
        body = self.server.name.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def backend(name: str) -> http.server.ThreadingHTTPServer:
    s = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Named)
    s.name = name
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return s


@needs_haproxy
def test_a_request_to_a_dead_backend_is_sent_to_the_live_one():
    a, b = backend("a"), backend("b")
    port = free_port()
    lb = Balancer(BalancerConfig("127.0.0.1", port, tuple((s.name, f"127.0.0.1:{s.server_address[1]}")
                                                          for s in (a, b)), check_ms=2000))
    try:
        url = f"http://127.0.0.1:{port}/v1/x"
        deadline = time.monotonic() + 10
        seen = set()
        while seen != {"a", "b"} and time.monotonic() < deadline:
            try:
                seen.add(httpx.post(url, json={"n": 1}, timeout=2).text)
            except httpx.HTTPError:
                time.sleep(0.1)
        assert seen == {"a", "b"}
        a.shutdown()
        a.server_close()     # refused from now on; the 2 s health check has not noticed yet
        got = [httpx.post(url, json={"n": i}, timeout=5) for i in range(6)]
        assert [(r.status_code, r.text) for r in got] == [(200, "b")] * 6
    finally:
        lb.stop()
        b.shutdown()
        b.server_close()
    assert lb.poll() is not None
