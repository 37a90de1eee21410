"""A worker does what its first request would wait for before it says it is ready (issue 53:
the first answer after the very first `make serve` took ~60 s, the next 0.5 s):
``LLMEngine.warm_up`` in ``build_app``, before the worker listens, registers and answers
``/ready``; and the warm-up leaves no trace (counters, caches, events, answers)."""

import json
import socket
import threading
import time
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.conftest import free_port
from warmpath.engine.llm_engine import EngineConfig, LLMEngine
from warmpath.engine.sequence import SamplingParams
from warmpath.engine.tiered_kv import TierConfig

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23], [5, 6, 7, 8]]
PARAMS = [SamplingParams(max_tokens=6, temperature=0.0),
          SamplingParams(max_tokens=6, temperature=0.9, top_p=0.8, repetition_penalty=1.2, seed=11)]


def engine(tiny, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model="tiny", num_blocks=64, **kw), loaded=tiny)


def state(e: LLMEngine) -> dict:
    s, p = e.scheduler, e.pool
    out = {"steps": e.num_steps, "busy": e.busy_seconds, "seqs": dict(e._seqs), "free": list(p._free),
           "cached": p.num_cached, "pool_stats": asdict(p.stats), "queried": s.prefix_query_tokens,
           "hit": s.prefix_hit_tokens, "preempted": s.num_preemptions, "gens": dict(e.runner.sampler._gens),
           "seen": dict(e.runner.sampler._seen), "waiting": len(s.waiting), "running": len(s.running)}
    if e.tiers is not None:
        out |= {"tier_stats": asdict(e.tiers.stats), "events": e.tiers.events._seq, "l2": len(e.tiers.l2.index)}
    return out


def test_warm_up_runs_the_model_and_leaves_no_trace(tiny):
    e = engine(tiny, tiers=TierConfig(l2_gib=0.01))       # L2 and KV events, no L3
    steps = []
    step = e.step
    e.step = lambda: steps.append(1) or step()
    before = state(e)
    took = e.warm_up()
    assert set(took) == {"model", "total"} and took["total"] >= took["model"] > 0   # tiny: no tokenizer
    assert len(steps) == 2                                 # one prefill of both requests, one decode
    assert state(e) == before                              # nothing cached, sealed, written below L1, announced
    e.close()


def test_a_warmed_engine_answers_as_a_fresh_one(tiny):
    warm, fresh = engine(tiny), engine(tiny)
    warm.warm_up()
    for e in (warm, fresh):
        e.outs = [e.generate(PROMPTS, PARAMS), e.generate(PROMPTS, PARAMS)]   # the second: prefix-cache hits
    assert warm.outs == fresh.outs and len(warm.outs[0][0]) == 6
    assert (warm.scheduler.prefix_hit_tokens, warm.num_steps) == (fresh.scheduler.prefix_hit_tokens, fresh.num_steps)
    assert warm.scheduler.prefix_hit_tokens == 16           # the 19-token prompt's one full block, once


def test_blocks_too_small_for_a_blockless_warm_up_skip_the_model(tiny):
    e = LLMEngine(EngineConfig(model="tiny", num_blocks=64, block_size=2), loaded=tiny)
    before = state(e)
    assert set(e.warm_up()) == {"total"} and state(e) == before


def test_warm_up_sends_one_block_through_l3_and_back(tiny, mooncake):
    from warmpath.kv.mooncake_config import MooncakeConfig

    l3 = MooncakeConfig(master=mooncake.master, metadata=mooncake.metadata, protocol="tcp", local_hostname="127.0.0.1")
    e = engine(tiny, tiers=TierConfig(l2_gib=0.01, l3=l3), worker_id="w-warm")
    before = state(e) | {"l3": asdict(e.tiers.l3.stats)}
    assert "l3" in e.warm_up()
    assert state(e) | {"l3": asdict(e.tiers.l3.stats)} == before           # the L3 counters too
    assert e.tiers.l3._store.is_exist("wp/warm-up/w-warm") == 1             # its one block, under its own key
    assert "l3" in e.warm_up()                                             # again (a restart): still works
    e.close()


class StubRouter:
    """Records when the worker registered (and answers heartbeats)."""

    def __init__(self, timeline: list) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):   # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/internal/register":
                    timeline.append(("register", time.monotonic(), body["worker_id"]))
                data = b"{}"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_the_worker_warms_up_before_it_listens_registers_or_says_ready(tiny):
    """As ``warmpath worker`` runs it (cli._run_http): build_app, then uvicorn on the port.
    A client polls the port from before build_app; the last warm-up step comes before the
    first connection accepted, the registration and the first ``/ready`` 200."""
    import uvicorn

    from warmpath.worker.app import ServerConfig, build_app
    from warmpath.worker.registration import RegistrationConfig

    timeline: list = []
    router = StubRouter(timeline)
    e = engine(tiny)
    step = e.step
    e.step = lambda: timeline.append(("step", time.monotonic(), None)) or step()
    port = free_port()
    reg = RegistrationConfig(router.url, "w0", "replica", f"http://127.0.0.1:{port}", heartbeat_s=0.2)
    servers = []

    def serve() -> None:
        app = build_app(e, ServerConfig(host="127.0.0.1", port=port, registration=reg))
        servers.append(uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")))
        servers[0].run()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        connected = ready = None
        deadline = time.monotonic() + 60
        while ready is None and time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    connected = connected or time.monotonic()
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                    ready = time.monotonic()
            except OSError:
                time.sleep(0.01)
        assert ready is not None, timeline
        while not any(k == "register" for k, *_ in timeline) and time.monotonic() < deadline:
            time.sleep(0.01)
        warm = [at for k, at, _ in timeline if k == "step"]
        registered = next(at for k, at, _ in timeline if k == "register")
        assert len(warm) == 2                               # the warm-up's two steps, and nothing since
        assert max(warm) < connected <= ready and max(warm) < registered
        assert set(servers[0].config.app.state.warm_up) == {"model", "total"}
    finally:
        if servers:
            servers[0].should_exit = True
        t.join(30)
        e.close()
