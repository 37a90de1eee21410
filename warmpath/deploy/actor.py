"""The Ray actor of ``warmpath deploy --ray``: it starts one real ``warmpath`` process on the
node Ray placed it on and lives exactly as long as that process.

When the process exits without being asked to, the actor's process exits too, so Ray's
own restart policy (the actor's ``max_restarts``) starts the actor, and with it the
process, again, on whatever node Ray picks. The class is plain Python: ``ray.remote`` is
applied by :mod:`warmpath.deploy.ray_deploy`, so importing this module does not import Ray.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from warmpath.deploy.placement import HOST
from warmpath.procs import die_with_parent
from warmpath.protocol.auth import API_KEY_ENV, CLUSTER_TOKEN_ENV


class ProcessHost:
    """One ``warmpath ARGV`` process (``{host}`` in ``argv`` becomes this node's address),
    with ``env`` added to its environment (secrets travel there, never in argv); ``spec`` is
    kept for later commands (``--scale`` reads the deployment's config from the router's)."""

    def __init__(self, name: str, argv: list[str], env: dict, spec=None) -> None:
        import ray

        self.name, self.spec_ = name, spec
        self.host = ray.util.get_node_ip_address()
        self.argv = [a.replace(HOST, self.host) for a in argv]
        self.reconstructed = ray.get_runtime_context().was_current_actor_reconstructed
        self.log_path = Path(ray.get_runtime_context().get_temp_dir()) / f"warmpath-{name}.log"
        self._secrets = {k: env[k] for k in (CLUSTER_TOKEN_ENV, API_KEY_ENV) if env.get(k)}
        self._stopping = False
        self.proc: subprocess.Popen | None = None
        started = threading.Event()
        threading.Thread(target=self._run, args=(env, started), daemon=True, name="warmpath-process").start()
        started.wait()
        if self.proc is None:
            raise RuntimeError(f"could not start warmpath {' '.join(self.argv)}: see {self.log_path}")
        self.started_at = time.time()

    def _run(self, env: dict, started: threading.Event) -> None:
        """Start the process from this thread, which lives as long as it does (the parent-death
        signal follows the thread that forked), then wait for its end."""
        try:
            with open(self.log_path, "ab") as log:
                log.write(f"--- {time.strftime('%H:%M:%S')} warmpath {' '.join(self.argv)}\n".encode())
                log.flush()
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "warmpath.cli", *self.argv], stdout=log, stderr=subprocess.STDOUT,
                    env={**os.environ, "MC_LOG_LEVEL": os.environ.get("MC_LOG_LEVEL", "ERROR"), **env},
                    preexec_fn=die_with_parent)  # noqa: PLW1509 - only sets the parent-death signal
        finally:
            started.set()
        code = self.proc.wait()
        if not self._stopping:   # died on its own: end this actor so that Ray restarts it
            print(f"warmpath deploy: {self.name} exited with {code}; ending its actor", file=sys.stderr, flush=True)
            os._exit(1)

    def info(self) -> dict:
        """Where and what it runs: node address, PID, argv, since when, whether Ray restarted it."""
        return {"name": self.name, "host": self.host, "pid": self.proc.pid, "returncode": self.proc.poll(),
                "argv": self.argv, "started_at": self.started_at, "reconstructed": self.reconstructed,
                "log": str(self.log_path)}

    def spec(self):
        return self.spec_

    def secret(self, env_name: str) -> str | None:
        """The cluster token or the API keys this process was given (for later commands)."""
        return self._secrets.get(env_name)

    def wait_output(self, text: str, timeout_s: float) -> bool:
        """Whether ``text`` appears in the process's output within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            if text in self.log_tail(200_000):
                return True
            time.sleep(0.2)
        return text in self.log_tail(200_000)

    def log_tail(self, chars: int = 3000) -> str:
        data = self.log_path.read_bytes()
        return data[-chars:].decode(errors="replace")

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM the process (a worker finishes its requests, then exits), SIGKILL after
        ``timeout_s``; the actor stays, ending nothing more. Returns its exit code."""
        self._stopping = True
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
