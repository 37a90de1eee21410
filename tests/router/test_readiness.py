"""Liveness vs readiness on a real router process with no workers yet."""

import httpx

from tests.conftest import serve_process


def test_a_router_without_a_complete_path_is_alive_but_not_ready():
    with serve_process("--route-policy", "cpd", command="router") as base:
        assert httpx.get(base + "/health").status_code == 200
        r = httpx.get(base + "/ready")
        assert r.status_code == 503 and r.json() == {"status": "not ready", "detail": "no healthy prefill worker"}
