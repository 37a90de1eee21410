"""Start and stop a private Mooncake Store: ``mooncake_master`` + one segment holder.

The master runs with its embedded HTTP metadata server on free loopback ports. The
holder is a small process that lends ``segment_bytes`` of memory to the store, so
stored blocks outlive the workers that wrote them (workers lend nothing by default).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from warmpath.procs import die_with_parent, free_port


def master_binary() -> str:
    """Path of ``mooncake_master`` (next to this Python, else on PATH)."""
    cand = Path(sys.executable).parent / "mooncake_master"
    if cand.is_file():
        return str(cand)
    found = shutil.which("mooncake_master")
    if not found:
        raise FileNotFoundError("mooncake_master not found; install mooncake-transfer-engine-non-cuda")
    return found


@dataclass
class MooncakeService:
    """A running master (+ holder). Use as a context manager or call ``stop()``."""

    host: str = "127.0.0.1"
    segment_bytes: int = 1 << 30
    log_dir: Path | None = None
    rpc_port: int = 0
    http_port: int = 0
    external_master: str | None = None      # segment only: lend memory to this master ("host:port")
    external_metadata: str | None = None    # ... and its metadata URL
    master_args: tuple[str, ...] = ()       # extra mooncake_master flags (e.g. eviction tuning)

    def __post_init__(self) -> None:
        self.master_proc: subprocess.Popen | None = None
        self.holder_proc: subprocess.Popen | None = None

    @property
    def master(self) -> str:
        return self.external_master or f"{self.host}:{self.rpc_port}"

    @property
    def metadata(self) -> str:
        return self.external_metadata or f"http://{self.host}:{self.http_port}/metadata"

    def _log(self, name: str):
        if self.log_dir is None:
            return subprocess.DEVNULL
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return open(self.log_dir / f"{name}.log", "ab")

    def start_master(self) -> None:
        """(Re)start the master on the same ports."""
        self.rpc_port = self.rpc_port or free_port(self.host)
        self.http_port = self.http_port or free_port(self.host)
        cmd = [master_binary(), f"--rpc_port={self.rpc_port}", "--enable_http_metadata_server=true",
               f"--http_metadata_server_host={self.host}", f"--http_metadata_server_port={self.http_port}",
               f"--metrics_port={free_port(self.host)}", "--enable_metric_reporting=false", *self.master_args]
        self.master_proc = subprocess.Popen(cmd, stdout=self._log("mooncake_master"),
                                            stderr=subprocess.STDOUT, start_new_session=True,
                                            preexec_fn=die_with_parent)
        deadline = time.time() + 15
        while time.time() < deadline:
            if self.master_proc.poll() is not None:
                raise RuntimeError(f"mooncake_master exited with {self.master_proc.returncode}")
            try:
                with socket.create_connection((self.host, self.http_port), timeout=0.2):
                    with socket.create_connection((self.host, self.rpc_port), timeout=0.2):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("mooncake_master did not start listening")

    def start(self) -> "MooncakeService":
        """Start the master (unless ``external_master``) and the segment holder (unless
        ``segment_bytes`` is 0); the holder announces itself as ``host``."""
        if self.external_master is None:
            self.start_master()
        if self.segment_bytes > 0:
            self.start_holder()
        return self

    def start_holder(self) -> None:
        """(Re)start the segment holder, lending ``segment_bytes`` to the master."""
        env = dict(os.environ, MC_LOG_LEVEL=os.environ.get("MC_LOG_LEVEL", "ERROR"))
        self.holder_proc = subprocess.Popen(
            [sys.executable, "-m", "warmpath.kv.mooncake_service", "--master", self.master,
             "--metadata", self.metadata, "--host", self.host, "--segment-bytes", str(self.segment_bytes)],
            stdout=subprocess.PIPE, stderr=self._log("mooncake_holder"), env=env, start_new_session=True,
            preexec_fn=die_with_parent)
        line = self.holder_proc.stdout.readline().decode().strip()
        if line != "ready":
            self.stop()
            raise RuntimeError(f"mooncake segment holder failed to start ({line!r})")

    def dead(self) -> list[str]:
        """Which of this service's processes have exited ("master", "holder")."""
        procs = {"master": self.master_proc, "holder": self.holder_proc}
        return [n for n, p in procs.items() if p is not None and p.poll() is not None]

    def restart_dead(self) -> list[str]:
        """Start again what exited, on the same ports; returns what was restarted.

        NOTE: a new master knows no segment, so a holder that outlived its master is
        restarted too (its memory, and the blocks in it, are gone with the old master).
        Clients need nothing: their next call after the restart reaches the new master.
        """
        gone = self.dead()
        if "master" in gone:
            if self.holder_proc is not None and "holder" not in gone:
                self.holder_proc.kill()
                self.holder_proc.wait()
                gone.append("holder")
            self.start_master()
        if "holder" in gone:
            self.start_holder()
        return gone

    def kill_master(self) -> None:
        """Kill -9 the master (failure tests)."""
        if self.master_proc is not None:
            self.master_proc.kill()
            self.master_proc.wait()

    def stop(self) -> None:
        for p in (self.holder_proc, self.master_proc):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    def __enter__(self) -> "MooncakeService":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _holder_main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--master", required=True)
    ap.add_argument("--metadata", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--segment-bytes", type=int, required=True)
    a = ap.parse_args()
    from mooncake.store import MooncakeDistributedStore

    st = MooncakeDistributedStore()
    rc = st.setup(a.host, a.metadata, a.segment_bytes, 16 << 20, "tcp", "", a.master)
    print("ready" if rc == 0 else f"setup failed {rc}", flush=True)
    if rc != 0:
        sys.exit(1)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    _holder_main()
