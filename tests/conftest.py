"""Shared fixtures: the real SmolLM2 model (loaded once) and free ports."""

import os
import socket

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def smollm():
    from warmpath.models.loader import load_model

    return load_model("smollm2")


@pytest.fixture(scope="session")
def tiny():
    from warmpath.models.loader import load_model

    return load_model("tiny", seed=0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mooncake():
    """A private Mooncake master + 256 MiB segment holder on free loopback ports."""
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
    from warmpath.kv.mooncake_service import MooncakeService

    with MooncakeService(segment_bytes=256 << 20) as svc:
        yield svc
