"""The load balancer in front of several routers (``warmpath serve --routers N``): HAProxy.

Clients keep one URL. HAProxy health-checks each router's ``/ready`` every ``check_ms``
(down after two failures, up after one success) and spreads requests round-robin. A request
whose connection to a router fails before any byte of the answer came back (refused, reset,
closed empty: the router was killed) is sent again to another router, up to ``retries``
times; one whose answer had begun is not (its client sees the stream end early). HAProxy
can resend only a request it still holds whole: bodies up to ``buffer_bytes``. Each answer
names the router that served it (``X-Warmpath-Router: router-I``).

The config is written to a private directory and HAProxy runs in the foreground as a child
of the launcher (it dies with it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from warmpath.procs import die_with_parent


@dataclass(frozen=True)
class BalancerConfig:
    """Where clients connect (``host``:``port``) and the routers behind it (``name -> host:port``)."""

    host: str
    port: int
    routers: tuple[tuple[str, str], ...]      # (name, "host:port")
    check_ms: int = 500
    retries: int = 3
    timeout_s: float = 660.0                  # an answer may stream this long (the router's own is 600 s)
    buffer_bytes: int = 256 * 1024
    maxconn: int = 4096

    def __post_init__(self) -> None:
        if not self.routers:
            raise ValueError("a balancer needs at least one router")
        if self.check_ms <= 0 or self.retries < 0:
            raise ValueError(f"need check_ms > 0 and retries >= 0, got {self.check_ms} / {self.retries}")


def haproxy_config(cfg: BalancerConfig) -> str:
    """The HAProxy configuration for ``cfg``."""
    servers = "\n".join(f"    server {name} {addr} check" for name, addr in cfg.routers)
    t = int(cfg.timeout_s * 1000)
    bind = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    return f"""global
    maxconn {cfg.maxconn}
    tune.bufsize {cfg.buffer_bytes}

defaults
    mode http
    timeout connect 2s
    timeout client {t}ms
    timeout server {t}ms
    timeout http-request 60s
    timeout http-keep-alive 60s
    retries {cfg.retries}
    option redispatch 1
    retry-on conn-failure empty-response junk-response

frontend warmpath
    bind {bind}:{cfg.port}
    default_backend routers

backend routers
    balance roundrobin
    option httpchk GET /ready
    http-check expect status 200
    http-response set-header X-Warmpath-Router %s
    default-server inter {cfg.check_ms}ms fastinter {cfg.check_ms}ms downinter {cfg.check_ms}ms fall 2 rise 1
{servers}
"""


def haproxy_binary() -> str:
    """HAProxy's path; ``RuntimeError`` saying how to install it when it is missing."""
    path = shutil.which("haproxy") or next((p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy")
                                            if os.access(p, os.X_OK)), None)
    if path is None:
        raise RuntimeError("--routers N > 1 needs HAProxy in front of the routers: `make setup` installs it "
                           "(apt-get install haproxy)")
    return path


class Balancer:
    """A running HAProxy for ``cfg``; :meth:`stop` ends it and removes its config."""

    def __init__(self, cfg: BalancerConfig) -> None:
        self.cfg = cfg
        self.dir = tempfile.mkdtemp(prefix="warmpath-haproxy-")
        self.path = Path(self.dir) / "haproxy.cfg"
        self.path.write_text(haproxy_config(cfg))
        binary = haproxy_binary()
        check = subprocess.run([binary, "-c", "-q", "-f", str(self.path)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"HAProxy refused its configuration: {check.stderr.strip()[:500]}")
        self.proc = subprocess.Popen([binary, "-db", "-f", str(self.path)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
