"""Requests that break HTTP itself, sent on raw sockets (bodies cut short of their
``Content-Length`` or of their last chunk, broken framing), and clients that leave in the
middle of an answer; with what a server must do about each (used by tests/launch/test_fuzz.py
and benchmarks/reliability/fuzz.py, beside tests/bad_requests.py's well-formed bad requests).

A server may close without answering a request it cannot read (its client is gone or cut
the body short); it must never answer one with a 5xx, and a request whose client left
must be aborted: its worker frees the KV blocks it held (``/metrics``)."""

from __future__ import annotations

import json
import socket
import time
from typing import Callable
from urllib.parse import urlsplit

import httpx

from warmpath.bench.prom import sample_value

CHAT = b"/v1/chat/completions"
BODY = b'{"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 2}'
# A request that runs long (on a CPU: seconds) unless its client's leaving aborts it (it fits
# a context window of 128 tokens).
LONG = {"messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 90,
        "ignore_eos": True, "temperature": 0}


def head(auth: dict, *lines: bytes, path: bytes = CHAT) -> bytes:
    """The request line and headers of a POST (the cluster token, the given header lines)."""
    cred = "".join(f"{k}: {v}\r\n" for k, v in auth.items()).encode()
    return b"POST " + path + b" HTTP/1.1\r\nHost: fuzz\r\n" + cred + b"".join(x + b"\r\n" for x in lines) + b"\r\n"


def cases(auth: dict) -> list[tuple[str, bytes, str, int | None]]:
    """``(name, bytes sent, then, status)``: after sending, ``then`` is ``half`` (end of
    input, then read), ``close`` (leave), or ``read``; ``status`` the one answer allowed,
    ``None`` where closing without an answer is right too (any answer must be < 500)."""
    cl = head(auth, b"Content-Type: application/json", b"Content-Length: %d" % (len(BODY) + 500)) + BODY
    te = head(auth, b"Transfer-Encoding: chunked")
    return [
        ("body shorter than its Content-Length, then end of input", cl, "half", None),
        ("body shorter than its Content-Length, then the client leaves", cl, "close", None),
        ("chunked body cut off, then end of input", te + b"10\r\n" + BODY[:16] + b"\r\n", "half", None),
        ("chunked body cut off mid-chunk, then the client leaves", te + b"100\r\n" + BODY[:40], "close", None),
        ("chunk size not hex", te + b"zz\r\n" + BODY + b"\r\n0\r\n\r\n", "read", 400),
        ("a chunk of 2^70 bytes announced, a few sent", te + b"400000000000000000\r\n" + BODY, "half", None),
        ("negative Content-Length", head(auth, b"Content-Length: -5"), "read", 400),
        ("two different Content-Lengths", head(auth, b"Content-Length: 3", b"Content-Length: 4") + b"{}", "read", 400),
        ("header line of 200 KB", head(auth, b"X-Big: " + b"a" * 200_000), "read", 400),
        ("not HTTP at all", b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03 TLS hello?\r\n\r\n", "read", 400),
    ]


def exchange(base: str, data: bytes, then: str, timeout: float = 15.0) -> bytes:
    """Send ``data`` on a fresh connection to ``base``; what came back (``b""``: nothing)."""
    u = urlsplit(base)
    with socket.create_connection((u.hostname, u.port), timeout=timeout) as s:
        s.sendall(data)
        if then == "close":
            return b""
        if then == "half":
            s.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
                if then == "read" and b"\r\n\r\n" in out:
                    break
        except (socket.timeout, ConnectionResetError):
            pass
        return out


def status_of(answer: bytes) -> int | None:
    """The status of a raw HTTP answer (``None``: no answer)."""
    parts = answer.split(b" ", 2)
    return int(parts[1]) if answer.startswith(b"HTTP/1.") and len(parts) > 1 and parts[1].isdigit() else None


def check_raw(base: str, auth: dict) -> list[str]:
    """Every raw case against ``base``; returns what went wrong."""
    wrong = []
    for name, data, then, want in cases(auth):
        try:
            got = status_of(exchange(base, data, then))
        except OSError as e:
            got, err = None, f"{type(e).__name__}: {e}"
        else:
            err = None
        if err is not None and want is not None:
            wrong.append(f"{name}: {err}")
        elif (want is not None and got != want) or (got is not None and got >= 500):
            wrong.append(f"{name}: got {got}, want {want if want is not None else 'no answer or < 500'}")
    return wrong


def leave_mid_stream(base: str, auth: dict, events: int = 3) -> int:
    """Start a long streamed answer, read ``events`` events of it, leave; returns the status."""
    body = json.dumps({**LONG, "stream": True}).encode()
    u = urlsplit(base)
    with socket.create_connection((u.hostname, u.port), timeout=120) as s:
        s.sendall(head(auth, b"Content-Type: application/json", b"Content-Length: %d" % len(body)) + body)
        got = b""
        while got.count(b"data:") < events and (chunk := s.recv(65536)):
            got += chunk
    return status_of(got) or 0


def leave_before_answer(base: str, auth: dict, started: Callable[[], bool], timeout: float = 120) -> None:
    """Start a long whole (not streamed) answer and leave once ``started()`` says it is being
    generated (see :func:`generating`; before that it may still be a prefill worker's, whose
    abort no counter shows)."""
    body = json.dumps(LONG).encode()
    u = urlsplit(base)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(head(auth, b"Content-Type: application/json", b"Content-Length: %d" % len(body)) + body)
        deadline = time.monotonic() + timeout
        while not started() and time.monotonic() < deadline:
            time.sleep(0.05)


def generating(workers: list[str]) -> Callable[[], bool]:
    """Whether one of these (decoding) workers is running a request."""
    return lambda: any(engine_state(w)["running"] >= 1 for w in workers)


def engine_state(worker: str) -> dict[str, float]:
    """A worker's running / waiting requests, L1 KV blocks in use (0-1) and aborted requests."""
    text = httpx.get(worker + "/metrics", timeout=10).text
    get = lambda name, **kw: sample_value(text, name, **kw) or 0.0   # noqa: E731
    return {"running": get("warmpath_num_requests_running"), "waiting": get("warmpath_num_requests_waiting"),
            "kv_usage": get("warmpath_kv_cache_usage_ratio"),
            "aborted": get("warmpath_requests_total", finish_reason="abort")}


def wait_idle(worker: str, timeout: float = 60.0) -> dict[str, float]:
    """Poll a worker until nothing runs or waits and its KV pool is all free (or ``timeout``);
    returns the last :func:`engine_state`."""
    deadline = time.monotonic() + timeout
    while True:
        st = engine_state(worker)
        if (st["running"], st["waiting"], st["kv_usage"]) == (0, 0, 0) or time.monotonic() > deadline:
            return st
        time.sleep(0.2)
