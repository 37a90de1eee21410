"""Which address to announce to other hosts (no I/O beyond a UDP ``connect``, which sends
nothing: the kernel only picks the route and its source address)."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

WILDCARDS = ("", "0.0.0.0", "::", "[::]")


def is_wildcard(host: str) -> bool:
    return host in WILDCARDS


def peer_host(peer: str) -> str | None:
    """``http://10.0.0.1:8000`` / ``10.0.0.1:50051[,http://…]`` → ``10.0.0.1``."""
    peer = peer.split(",")[0].strip()
    if "://" not in peer:
        peer = "tcp://" + peer
    try:
        return urlsplit(peer).hostname
    except ValueError:
        return None


def route_source(peer: str) -> str | None:
    """The local address this host uses to reach ``peer`` (``None`` when unknown)."""
    host = peer_host(peer)
    if not host:
        return None
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def url_host(host: str) -> str:
    """A host as it goes into a URL (IPv6 literals in brackets)."""
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


def parse_kv_store(spec: str):
    """``host:port[,http://...]`` → (master, metadata URL)."""
    master, _, meta = spec.partition(",")
    host, sep, port = master.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--kv-store: expected HOST:PORT[,METADATA_URL], got {spec!r}")
    return master, meta or f"http://{host}:8080/metadata"
