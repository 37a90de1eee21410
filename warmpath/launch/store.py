"""``warmpath store``: run a Mooncake master and/or a store segment on this host.

Multi-host deployments start one master (with its HTTP metadata server) somewhere and lend
memory to the store from any host with a segment; workers and the router find it through
``--kv-store MASTER,METADATA_URL``. ``warmpath serve`` keeps starting a private one.
"""

from __future__ import annotations

import argparse
import signal
import time


def add_parser(sub) -> None:
    p = sub.add_parser("store", help="run a Mooncake master and/or a store segment on this host")
    p.add_argument("--host", default="127.0.0.1",
                   help="this host's address: the master and metadata server bind it, the segment "
                        "announces it (a concrete address, not 0.0.0.0)")
    p.add_argument("--master-port", type=int, default=50051, help="master RPC port (0 = a free port)")
    p.add_argument("--metadata-port", type=int, default=8080, help="HTTP metadata port (0 = a free port)")
    p.add_argument("--segment-gib", type=float, default=2.0, help="memory this host lends to the store (0 = none)")
    p.add_argument("--no-master", action="store_true",
                   help="only a segment, lending memory to the master named by --kv-store")
    p.add_argument("--kv-store", default=None, metavar="MASTER[,METADATA_URL]",
                   help="with --no-master: the master to join")
    p.set_defaults(fn=run_store)


def run_store(a: argparse.Namespace) -> int:
    """Start what was asked, print where it is, and run until SIGINT / SIGTERM."""
    from warmpath.launch.netaddr import parse_kv_store
    from warmpath.launch.netaddr import is_wildcard
    from warmpath.kv.mooncake_service import MooncakeService

    if is_wildcard(a.host):
        raise ValueError("store --host must be this host's address as others reach it, not a wildcard")
    if a.segment_gib < 0:
        raise ValueError(f"--segment-gib must be >= 0, got {a.segment_gib}")
    ext_master = ext_meta = None
    if a.no_master:
        if not a.kv_store:
            raise ValueError("--no-master needs --kv-store MASTER[,METADATA_URL] (the master to join)")
        if a.segment_gib == 0:
            raise ValueError("--no-master with --segment-gib 0 would run nothing")
        ext_master, ext_meta = parse_kv_store(a.kv_store)
    svc = MooncakeService(host=a.host, segment_bytes=int(a.segment_gib * (1 << 30)), rpc_port=a.master_port,
                          http_port=a.metadata_port, external_master=ext_master, external_metadata=ext_meta)
    stop = {"sig": None}
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, _f: stop.__setitem__("sig", s))
    svc.start()
    try:
        what = "segment" if a.no_master else "master" + (" + segment" if a.segment_gib else "")
        print(f"warmpath store: {what} on {a.host} ({a.segment_gib:g} GiB lent)\n"
              f"  workers and router: --kv-store {svc.master},{svc.metadata}", flush=True)
        while stop["sig"] is None:
            if svc.master_proc is not None and svc.master_proc.poll() is not None:
                print(f"warmpath store: mooncake_master exited ({svc.master_proc.returncode})", flush=True)
                return 1
            if svc.holder_proc is not None and svc.holder_proc.poll() is not None:
                print(f"warmpath store: segment holder exited ({svc.holder_proc.returncode})", flush=True)
                return 1
            time.sleep(0.5)
        return 0
    finally:
        svc.stop()
