"""A real headless browser for tests: Debian's ``chromium`` driven through ``chromedriver``'s
W3C WebDriver HTTP API (with httpx, so no extra Python package and nothing online).

``make setup-test`` installs ``chromium`` and ``chromium-driver`` when missing; the
``browser`` fixture skips, saying why, only where neither is installed.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1200"]


def find_browser() -> tuple[str, str] | None:
    """``(chromium, chromedriver)`` paths, or ``None`` when either is missing."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    return (binary, driver) if binary and driver else None


class Browser:
    """One chromedriver process and one headless session (as root: ``--no-sandbox``)."""

    def __init__(self, binary: str, driver: str) -> None:
        port = free_port()
        self.proc = subprocess.Popen([driver, f"--port={port}"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        self.wait_for(lambda: self._ready(), 30, "chromedriver did not start")
        caps = {"browserName": "chrome", "goog:chromeOptions": {"binary": binary, "args": ARGS}}
        self.sid = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})["sessionId"]

    def _ready(self) -> bool:
        try:
            return self.http.get("/status").json()["value"]["ready"]
        except httpx.HTTPError:
            return False

    def _call(self, method: str, path: str, body: dict | None = None):
        r = self.http.request(method, path, json=body)
        value = r.json()["value"]
        if r.status_code != 200:
            raise RuntimeError(f"webdriver {path}: {value}")
        return value

    def get(self, url: str) -> None:
        """Open ``url`` (returns once the page has loaded)."""
        self._call("POST", f"/session/{self.sid}/url", {"url": url})

    def js(self, script: str, *args):
        """Run ``script`` (a function body; ``return`` its result) in the page."""
        return self._call("POST", f"/session/{self.sid}/execute/sync", {"script": script, "args": list(args)})

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self._call("GET", f"/session/{self.sid}/screenshot")))
        return path

    @staticmethod
    def wait_for(pred, timeout: float, what: str):
        """Poll ``pred()`` until truthy (returns it); ``AssertionError(what)`` on timeout."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if got := pred():
                return got
            time.sleep(0.25)
        raise AssertionError(what)

    def close(self) -> None:
        try:
            self.http.delete(f"/session/{self.sid}")
        finally:
            self.http.close()
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def browser():
    found = find_browser()
    if found is None:
        pytest.skip("no chromium + chromedriver installed (make setup-test installs Debian's "
                    "chromium and chromium-driver)")
    b = Browser(*found)
    yield b
    b.close()
