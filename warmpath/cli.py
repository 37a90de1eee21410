"""``warmpath`` command line."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from warmpath.cli_args import (_auth_args, _auto, _engine_args, _gib, _override, _positive,  # noqa: F401 - re-exported
                               _store_gib, _worker_args, add_serve_parser, advertise_host,
                               engine_config, serve_namespace, size_cluster_store, tier_config)


def _serve(a: argparse.Namespace) -> int:
    import re

    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", a.worker_id):
        raise ValueError(f"--worker-id must be 1-64 of A-Z a-z 0-9 . _ -, got {a.worker_id!r}")
    if a.engine == "vllm" and a.cmd == "serve" and a.topology == "single":
        raise ValueError("serve --engine vllm needs a --topology (e.g. replica): a vLLM worker serves "
                         "behind warmpath's router")
    if a.engine == "vllm" and a.cmd == "worker":
        from warmpath.vllm.connector import check_flags

        check_flags(a.role, a.vllm_kv_connector)
    if a.cmd == "serve" and a.topology != "single":
        from warmpath.launch.launcher import serve_cluster
        from warmpath.launch.topology import resolve

        resolve(a.topology, a.ppd, a.route_policy).check_handoff(a.engine, a.vllm_kv_connector)

        return serve_cluster(size_cluster_store(a), _model_id(a.model))
    import uvicorn

    from warmpath.protocol.auth import api_keys, cluster_token, warn_if_open

    a.cluster_token, a.api_key = cluster_token(a.cluster_token), list(api_keys(a.api_key))
    warn_if_open(a.host, a.cluster_token, "this worker")
    if a.engine == "vllm":
        from warmpath.vllm.worker import run

        return run(a, _model_id(a.model), advertise_host(a))

    from warmpath.engine.llm_engine import LLMEngine
    from warmpath.worker.app import ServerConfig, build_app

    from warmpath.kv.mooncake_service import MooncakeService
    from warmpath.kv.mooncake_config import quiet_mooncake_logs

    quiet_mooncake_logs(logging.getLogger().level)
    sock = None
    if a.port == 0:  # bind now and advertise the port we got: no window for another process to take it
        import socket

        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((a.host, 0))
        a.port = sock.getsockname()[1]
    registration = None
    if a.router:
        from warmpath.launch.netaddr import url_host
        from warmpath.worker.registration import RegistrationConfig

        registration = RegistrationConfig(a.router.rstrip("/"), a.worker_id, a.role,
                                          f"http://{url_host(advertise_host(a))}:{a.port}", a.heartbeat_s,
                                          cluster_token=a.cluster_token)
    import os

    scfg = ServerConfig(host=a.host, port=a.port, default_max_tokens=a.default_max_tokens,
                        generation_override=a.override_generation_config,
                        registration=registration, max_body_bytes=int(a.max_body_mib * (1 << 20)), max_waiting=a.max_waiting,
                        fault_injection=os.environ.get("WARMPATH_FAULT_INJECTION") == "1",
                        cluster_token=a.cluster_token, api_keys=tuple(a.api_key), drain_timeout_s=a.drain_timeout_s)
    service = None
    if not a.no_l3 and a.kv_store is None:
        a.l3_gib = _store_gib(a, 1)
        service = MooncakeService(host="127.0.0.1", segment_bytes=int(a.l3_gib * (1 << 30))).start()
        logging.getLogger("warmpath").info("started mooncake_master at %s", service.master)
    try:
        engine = LLMEngine(engine_config(a, tier_config(a, service)))
        try:
            return _run_http(a, engine, scfg, build_app, uvicorn, sock)
        finally:
            engine.close()
    finally:
        if service is not None:
            service.stop()


def _run_http(a, engine, scfg, build_app, uvicorn, sock=None) -> int:
    app = build_app(engine, scfg)
    name = engine.loaded.model_id
    print(f"warmpath: serving {name} ({getattr(a, 'topology', a.role)}) on http://{a.host}:{a.port}/v1\n"
          f"  try: curl http://{a.host}:{a.port}/v1/chat/completions -H 'Content-Type: application/json' "
          f"-d '{{\"model\": \"{name}\", \"messages\": [{{\"role\": \"user\", "
          f"\"content\": \"What is the capital of France?\"}}]}}'\n"
          f"  defaults for fields a request leaves out: {app.state.defaults.describe()}", flush=True)
    from warmpath.worker.drain import DrainingServer, InFlight

    counted = InFlight(app)
    server = DrainingServer(uvicorn.Config(counted, host=a.host, port=a.port, log_level=a.log_level.lower(),
                                           timeout_graceful_shutdown=10), app.state.drain, counted, _drain_teller(scfg))
    app.state.request_exit = lambda: setattr(server, "should_exit", True)
    server.run(sockets=[sock] if sock is not None else None)
    if app.state.aengine.error is not None:
        print(f"warmpath: error: the engine stopped ({app.state.aengine.error!r}); exiting so that "
              "a supervisor restarts this worker", file=sys.stderr)
        return 1
    return 0


def _drain_teller(scfg):
    """What a draining worker tells its router (nothing without one)."""
    from warmpath.worker.registration import report_drain

    async def tell(left: bool) -> int | None:
        return None if scfg.registration is None else await report_drain(scfg.registration, left)
    return tell


def _model_id(model: str) -> str:
    from warmpath.models.files import served_model_id

    return served_model_id(model)


def _router(a: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    import uvicorn

    from warmpath.models.files import load_tokenizer
    from warmpath.engine.step_model import StepModel
    from warmpath.routing.flags import (DEFAULT_POLICY, admission_from_args, elastic_from_args, policy_from_args,
                                        tenants_from_args)
    from warmpath.routing.ppd import PPDConfig, PPDTable
    from warmpath.routing.peers import PeerConfig
    from warmpath.routing.registry import DiscoveryConfig
    from warmpath.protocol.auth import api_keys, cluster_token, warn_if_open
    from warmpath.router.app import build_router
    from warmpath.router.state import RouterConfig, RouterState

    token = cluster_token(a.cluster_token)
    warn_if_open(a.host, token, "the router")
    table, steps = None, None
    if a.calibration:
        try:
            cal = json.loads(Path(a.calibration).read_text())
            table = PPDTable.from_json(cal["ppd_table"])
            steps = StepModel.from_json(cal["step_model"]) if "step_model" in cal else None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"--calibration {a.calibration}: not a `warmpath calibrate` output ({e})") from e
    name, ppd = a.route_policy or DEFAULT_POLICY, a.ppd or "off"
    policy = policy_from_args(a, name)
    own = (a.advertise_url or f"http://{a.host}:{a.port}").rstrip("/")   # --peer may list every router, this one too
    cfg = RouterConfig(a.host, a.port, admission_from_args(a), DiscoveryConfig(a.heartbeat_s, a.drop_after_s),
                       ppd=None if ppd == "off" else PPDConfig(ppd), session_idle_s=a.session_idle_s,
                       max_body_bytes=int(a.max_body_mib * (1 << 20)),
                       cluster_token=token, api_keys=api_keys(a.api_key),
                       elastic=elastic_from_args(a, name, policy), tenants=tenants_from_args(a),
                       peers=PeerConfig(tuple(u.rstrip("/") for u in a.peer or () if u.rstrip("/") != own),
                                        a.peer_every_s, a.peer_alive_s),
                       advertise_url=own)
    state = RouterState(policy, load_tokenizer(a.model), _model_id(a.model), cfg, table)
    if steps is not None:   # the goodput policy's TPOT predictions price steps with the calibration
        state.decider.model.steps[None] = steps
    from warmpath.procs import trim_heap

    trim_heap()   # the tokenizer's temporaries (~20 MiB)
    print(f"warmpath router ({name}, PPD {ppd}) on http://{a.host}:{a.port}/v1", flush=True)
    uvicorn.run(build_router(state), host=a.host, port=a.port, log_level=a.log_level.lower())
    return 0


def _prepare(a: argparse.Namespace) -> int:
    from warmpath.models.loader import load_model

    lm = load_model(a.model)
    print(f"warmpath: model {lm.model_id} ready (revision {lm.revision}, converted at {lm.hf_dir})")
    return 0


_CORE_COMMANDS = ("serve", "worker", "router", "prepare")


def _command(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names (the first word after the global ``--log-level``)."""
    i = 0
    while i < len(argv):
        if argv[i] == "--log-level":
            i += 2
        elif argv[i].startswith("-"):
            i += 1
        else:
            return argv[i]
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``warmpath`` command line: every subcommand, or (``only``) the core ones and that
    one, so that starting a worker does not import the benchmark and simulator modules."""
    from warmpath.routing.flags import add_routing_args

    p = argparse.ArgumentParser(prog="warmpath", description=__doc__)
    p.add_argument("--log-level", default="INFO")
    sub = p.add_subparsers(dest="cmd", required=True)
    add_serve_parser(sub, fn=_serve)
    w = sub.add_parser("worker", help="one worker that registers with a router")
    _worker_args(w, role_required=True)
    w.set_defaults(fn=_serve)
    rt = sub.add_parser("router", help="cache-aware router in front of registered workers")
    rt.add_argument("--host", default="127.0.0.1")
    rt.add_argument("--port", type=int, default=8000)
    rt.add_argument("--model", default="smollm2", help="tokenizer/model the workers serve")
    rt.add_argument("--calibration", default=None, help="`warmpath calibrate` output (PPD table; step model "
                    "for the goodput policy's TPOT predictions)")
    add_routing_args(rt)
    rt.add_argument("--heartbeat-s", type=float, default=10.0)
    rt.add_argument("--drop-after-s", type=float, default=30.0)
    rt.add_argument("--session-idle-s", type=float, default=3600.0)
    rt.add_argument("--max-body-mib", type=_positive, default=8.0, help="largest request body accepted (413 beyond)")
    ha = rt.add_argument_group("several routers, active-active (serve --routers N starts them)")
    ha.add_argument("--peer", action="append", default=None, metavar="URL",
                    help="another router fronting the same workers (repeatable): the routers share their load "
                         "and the admission limit, and a router that starts follows the peers' workers at once")
    ha.add_argument("--peer-every-s", type=_positive, default=0.25, help="how often this router reports to its peers")
    ha.add_argument("--peer-alive-s", type=_positive, default=1.0,
                    help="a peer silent this long no longer counts (its load, its share of the limit)")
    ha.add_argument("--advertise-url", default=None,
                    help="how the peers name this router (default http://HOST:PORT)")
    _auth_args(rt)
    rt.set_defaults(fn=_router)
    pr = sub.add_parser("prepare", help="convert and cache the model weights")
    pr.add_argument("--model", default="smollm2")
    pr.set_defaults(fn=_prepare)
    for name, (module, kwargs) in _MORE_COMMANDS.items():
        if only is None or only == name:
            importlib.import_module(module).add_parser(sub, **kwargs)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmd = _command(argv)
    a = build_parser(only=cmd if cmd in _MORE_COMMANDS or cmd in _CORE_COMMANDS else None).parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from warmpath.models.gguf_loader import ModelFileError

    try:
        return a.fn(a)
    except ModelFileError as e:
        print(f"warmpath: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"warmpath: error: {e}", file=sys.stderr)
        return 2


def _bench(a: argparse.Namespace) -> int:
    """`warmpath bench`; with ``--sim`` the sweep runs in the simulator."""
    from warmpath.bench.cli import main as bench_main

    if a.sim:
        from warmpath.sim.cli import bench_sweep

        return bench_main(a, bench_sweep)
    return bench_main(a)


# subcommands whose modules a worker, router or serve start need not import (~1 s on 2 cores)
_MORE_COMMANDS = {
    "store": ("warmpath.launch.store", {}), "manifests": ("warmpath.launch.manifests_cli", {}),
    "deploy": ("warmpath.deploy.cli", {}), "calibrate": ("warmpath.calibrate.cli", {}),
    "bench": ("warmpath.bench.cli", {"fn": _bench}), "sim": ("warmpath.sim.cli", {}),
    "repro": ("warmpath.sim.repro", {}), "map": ("warmpath.sim.map_cli", {}), "plan": ("warmpath.plan.cli", {}),
}


if __name__ == "__main__":
    sys.exit(main())
