"""``warmpath worker|serve --engine vllm``'s flags (the worker starts and supervises a vLLM
server, ``warmpath/vllm/``); kept apart from ``cli_args`` so that file stays one screenful per group."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def vllm_args(p: argparse.ArgumentParser, _positive: Callable[[str], float]) -> None:
    """``--engine vllm``: the worker starts and supervises a vLLM server (``warmpath/vllm/``).
    ``_positive``: the command line's own "> 0" type (``cli_args``), passed in so this module
    imports nothing of the command line."""
    g = p.add_argument_group("vLLM engine (--engine vllm)")
    g.add_argument("--engine", default="warmpath", choices=("warmpath", "vllm"),
                   help="warmpath's own engine, or a vLLM OpenAI server started and supervised by this worker "
                        "(replica, or P/D roles with --vllm-kv-connector; --model, --block-size, --max-num-seqs, --max-model-len, --dtype and "
                        "--kv-cache-gib apply to it)")
    g.add_argument("--vllm-python", default=None, metavar="PATH",
                   help="the Python that runs `-m vllm.entrypoints.openai.api_server` (default: the venv "
                        "`python -m benchmarks.peers.vllm_cpu` installs)")
    g.add_argument("--vllm-command", default=None, metavar="CMD",
                   help="the command that starts vLLM's OpenAI server, before its flags (instead of --vllm-python)")
    g.add_argument("--vllm-args", default=None, metavar="ARGS", help="more vLLM flags, as one shell-quoted string")
    g.add_argument("--vllm-port", type=int, default=0, help="vLLM's own HTTP port on 127.0.0.1 (0 = a free one)")
    g.add_argument("--vllm-cpus", default=None, metavar="LIST",
                   help="VLLM_CPU_OMP_THREADS_BIND, e.g. 0-1 (default: the CPUs this worker may use, e.g. its pin)")
    g.add_argument("--vllm-startup-s", type=_positive, default=900.0, help="how long vLLM may take to answer")
    g.add_argument("--vllm-log", default=None, metavar="FILE", help="vLLM's output (default: this worker's)")
    g.add_argument("--vllm-kv-connector", default=None, metavar="nixl|mooncake|JSON",
                   help="vLLM's KV connector, for the P/D roles (--role prefill / pre-prefill / decode): nixl "
                        "(NixlConnector, kv_both), mooncake, or a whole JSON --kv-transfer-config "
                        "(default: none, replica only; docs/vllm.md)")
    g.add_argument("--vllm-kv-buffer-device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="NIXL's kv_buffer_device (auto: cuda when an NVIDIA device is present, else cpu)")
