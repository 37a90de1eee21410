"""Several routers, active-active, behind HAProxy (``warmpath serve --routers N``)."""

from __future__ import annotations

from warmpath.launch.balancer import Balancer, BalancerConfig


def is_router(name: str) -> bool:
    """Is the process ``name`` a router (``router``, or ``router-I`` of several)?"""
    return name == "router" or name.startswith("router-")


def spawn_routers(c, n: int, host: str, port: int, log_level: str, argv: list[str]) -> Balancer:
    """Spawn ``n`` routers (``c.spawn``) on free ports of ``host``, each a peer of the others,
    and start HAProxy on ``port`` in front (returned)."""
    from warmpath.launch.netaddr import is_wildcard, url_host

    near = "127.0.0.1" if is_wildcard(host) else host
    ports = sorted(free_ports(near, n))   # router-I: the I-th by port (HAProxy names it so in X-Warmpath-Router)
    c.router_urls = tuple(f"http://{url_host(near)}:{p}" for p in ports)
    for i, p in enumerate(ports):
        peers = [f for j, u in enumerate(c.router_urls) if j != i for f in ("--peer", u)]
        c.spawn(f"router-{i}", ["--log-level", log_level, "router", "--host", near, "--port", str(p),
                                "--advertise-url", c.router_urls[i], *peers, *argv])
    backends = tuple((f"router-{i}", f"{url_host(near)}:{p}") for i, p in enumerate(ports))
    return Balancer(BalancerConfig(host, port, backends))


def free_ports(host: str, n: int) -> list[int]:
    """``n`` distinct ports free on ``host`` now (the OS's ephemeral picks, released again)."""
    import socket

    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
