"""warmpath vs llama.cpp's OpenAI server (llama-cpp-python) on the same SmolLM2 GGUF file.

One run: each server alone on the machine in turn (they would fight over 2 cores), the
multi-turn chat and coding-agent workloads at a few rates, through ``warmpath bench``.

llama-cpp-python compiles from source (~20 min here): build its wheel once outside the
repository and give a Python that has it, e.g.::

    pip wheel --no-deps -w /root/wheels llama-cpp-python==0.3.36
    python3 -m venv /root/llama-venv && /root/llama-venv/bin/pip install /root/wheels/llama_cpp_python-*.whl \
        'llama-cpp-python[server]==0.3.36'
    .venv/bin/python benchmarks/vs_llamacpp.py --llama-python /root/llama-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

from warmpath.procs import free_port
from warmpath.models.loader import smollm2_gguf_path


def wait_healthy(base: str, proc: subprocess.Popen, path: str, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode})")
        try:
            if httpx.get(base + path, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{base} not healthy")


def start(name: str, llama_python: str, threads: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    if name == "warmpath":
        cmd = [sys.executable, "-m", "warmpath.cli", "--log-level", "warning", "serve", "--port", str(port),
               "--threads", str(threads)]
        health = "/health"
    else:
        cmd = [llama_python, "-m", "llama_cpp.server", "--model", str(smollm2_gguf_path()), "--host", "127.0.0.1",
               "--port", str(port), "--n_ctx", "8192", "--n_threads", str(threads),
               "--n_threads_batch", str(threads), "--model_alias", "SmolLM2-135M-Instruct"]
        health = "/v1/models"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    wait_healthy(base, proc, health)
    return proc, base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-python", required=True)
    ap.add_argument("--rates", default="0.1,0.2,0.4")
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--slo", default="ttft_p90=2.0,tpot=0.2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/vs_llamacpp"))
    a = ap.parse_args()
    results: dict = {}
    for server in ("warmpath", "llama.cpp"):
        proc, base = start(server, a.llama_python, a.threads)
        try:
            for wl in ("multi-turn-chat", "coding-agent"):
                out = a.out / f"{server}-{wl}"
                cmd = [sys.executable, "-m", "warmpath.cli", "bench", "--url", base, "--workload", wl,
                       "--rates", a.rates, "--duration", str(a.duration), "--scale", str(a.scale),
                       "--slo", a.slo, "--out", str(out), "--text-prompts", "--quiet"]
                subprocess.run(cmd, check=True)
                results[f"{server}/{wl}"] = json.loads((out / "summary.json").read_text())
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    rows = ["| server | workload | rate | TTFT p50 s | TTFT p90 s | TPOT s | tok/s | failed |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    for key, s in results.items():
        server, wl = key.split("/")
        for rate, cls in s["rates"].items():
            c = cls["all"]
            rows.append(f"| {server} | {wl} | {rate} | {f(c['ttft_p50_s'])} | {f(c['ttft_p90_s'])} | "
                        f"{f(c['tpot_s'])} | {f(c['throughput_tok_s'])} | {c['failed']} |")
        rows.append(f"| {server} | {wl} | max rate meeting SLO | {s.get('max_rate_meeting_slo')} | | | | |")
    table = "\n".join(rows)
    print(table)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "table.md").write_text(table + "\n")
    (a.out / "all.json").write_text(json.dumps(results, indent=1))
    from warmpath.bench.plots import plot_summaries

    for wl in ("multi-turn-chat", "coding-agent"):
        plot_summaries({k.split("/")[0]: v for k, v in results.items() if k.endswith(wl)}, a.out / wl)


if __name__ == "__main__":
    main()
