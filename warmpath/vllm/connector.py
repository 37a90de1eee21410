"""Which of vLLM's KV connectors a vLLM worker runs (``--vllm-kv-connector``): its
``--kv-transfer-config``, its environment, the roles it allows, and the connector wheels
(pure, except :func:`install_wheels`).

``nixl``: ``NixlConnector``, ``kv_role: kv_both`` (a worker can be either side of a hand-off,
so elastic roles and PPD-local turns need no restart), ``kv_buffer_device`` ``cpu`` on a CPU
build of vLLM (host memory over UCX) or ``cuda``; its side channel (the ZeroMQ socket the decode
side's handshake reaches) listens on ``VLLM_NIXL_SIDE_CHANNEL_HOST:PORT``, one port per worker.
``mooncake``: ``MooncakeConnector`` over TCP, ``kv_producer`` on a prefill worker and
``kv_consumer`` on a decode worker (it has no ``kv_both``). Anything else: a JSON
``kv-transfer-config`` given whole (``{"kv_connector": ...}``), used as it is.

What vLLM 0.32's CPU build does with them on this machine: docs/vllm.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CONNECTORS = ("nixl", "mooncake")
BUFFER_DEVICES = ("auto", "cpu", "cuda")
PD_ROLES = ("pre-prefill", "prefill", "decode")
# the wheels the named connectors import, installed (no dependencies) into a folder of their own
# that the vLLM server gets on its PYTHONPATH: the vLLM venv stays as installed
WHEELS = {"nixl": ("nixl==1.5.1", "nixl-cu12==1.5.1"), "mooncake": ("mooncake-transfer-engine-non-cuda==0.3.13.post1",)}


def check_role(role: str, connector: str | None) -> None:
    """``ValueError`` when a vLLM worker cannot take ``role``: the P/D roles need a connector."""
    if role in PD_ROLES and not connector:
        raise ValueError(f"--engine vllm --role {role} needs a KV connector (--vllm-kv-connector "
                         f"{'|'.join(CONNECTORS)}|JSON): vLLM hands the prompt's KV from the prefill to the decode "
                         "server through it; without one a vLLM worker runs --role replica only")


def check_flags(role: str, connector: str | None) -> None:
    """``warmpath worker --engine vllm``'s role and connector flags, checked before anything
    starts (``ValueError`` naming the problem)."""
    check_role(role, connector)
    if connector:
        kv_transfer_config(connector, role, "cpu")


def buffer_device(flag: str, cuda_present: bool | None = None) -> str:
    """``--vllm-kv-buffer-device``: ``auto`` is ``cuda`` when this host has an NVIDIA device
    (``/dev/nvidiactl``), else ``cpu``."""
    if flag not in BUFFER_DEVICES:
        raise ValueError(f"--vllm-kv-buffer-device must be one of {BUFFER_DEVICES}, got {flag!r}")
    if flag != "auto":
        return flag
    present = Path("/dev/nvidiactl").exists() if cuda_present is None else cuda_present
    return "cuda" if present else "cpu"


def kv_transfer_config(spec: str, role: str, device: str) -> dict:
    """vLLM's ``--kv-transfer-config`` for connector ``spec`` on a worker of ``role`` with its
    KV buffer on ``device`` (``cpu`` / ``cuda``); ``ValueError`` naming what is wrong."""
    if spec == "nixl":
        return {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": device}
    if spec == "mooncake":
        if role == "replica":
            raise ValueError("--vllm-kv-connector mooncake: a replica has no hand-off side (kv_producer on a "
                             "prefill worker, kv_consumer on a decode worker)")
        return {"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer" if role == "decode" else "kv_producer",
                "kv_connector_extra_config": {"mooncake_protocol": "tcp"}}
    if not spec.lstrip().startswith("{"):
        raise ValueError(f"--vllm-kv-connector must be one of {CONNECTORS} or a JSON kv-transfer-config, got {spec!r}")
    try:
        cfg = json.loads(spec)
    except json.JSONDecodeError as e:
        raise ValueError(f"--vllm-kv-connector: not valid JSON ({e})") from e
    if not isinstance(cfg, dict) or not isinstance(cfg.get("kv_connector"), str) or not cfg["kv_connector"]:
        raise ValueError(f"--vllm-kv-connector: a JSON kv-transfer-config needs a \"kv_connector\" name, got {spec!r}")
    return cfg


def connector_env(cfg: dict, side_host: str, side_port: int) -> dict[str, str]:
    """The environment a vLLM server with ``cfg`` needs: NIXL's side channel (host, port) and
    the connector's wheels on ``PYTHONPATH`` when :func:`install_wheels` put them here."""
    env: dict[str, str] = {}
    if cfg["kv_connector"].startswith("Nixl"):
        env |= {"VLLM_NIXL_SIDE_CHANNEL_HOST": side_host, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_port),
                "VLLM_HOST_IP": side_host}
    name = {"NixlConnector": "nixl", "MooncakeConnector": "mooncake"}.get(cfg["kv_connector"])
    if name is not None and (wheels_dir(name) / ".done").is_file():
        env["PYTHONPATH"] = str(wheels_dir(name))
    return env


def wheels_dir(name: str, root: Path | None = None) -> Path:
    """Where :func:`install_wheels` puts connector ``name``'s wheels (``$WARMPATH_PEERS_DIR`` or
    ``~/.cache/warmpath/peers``, then ``vllm-connectors/<name>``)."""
    from warmpath.vllm.server import default_root

    return (root or default_root().parent / "vllm-connectors") / name


def install_wheels(name: str, root: Path | None = None) -> Path:
    """Connector ``name``'s wheels unpacked (``pip install --no-deps --target``) once; the folder.
    ``subprocess.CalledProcessError`` when pip cannot get them."""
    target = wheels_dir(name, root)
    if not (target / ".done").is_file():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                        *WHEELS[name]], check=True)
        (target / ".done").touch()
    return target


if __name__ == "__main__":   # python -m warmpath.vllm.connector nixl
    print(install_wheels(sys.argv[1] if len(sys.argv) > 1 else "nixl"))
