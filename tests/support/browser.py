"""Drive a real headless Chromium (Debian's ``chromium`` package) over the DevTools protocol.

Only what the UI test needs: open a page, wait for a JavaScript condition, click, read text, and
save screenshots. The protocol runs over one websocket (``websockets``' synchronous client); the
browser is a real subprocess with its own throwaway profile.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect


def headless_chromium(*, width: int = 1600, height: int = 1200) -> Iterator[Browser]:
    """A browser for a module's tests (a pytest fixture's body), or a skip that names the reason."""
    import pytest

    executable = find_chromium()
    if executable is None:
        pytest.skip("no Chromium on PATH: `apt-get install chromium` (scripts/test does it as root)")
    with Browser(executable, width=width, height=height) as b:
        yield b


def find_chromium() -> str | None:
    """The Chromium executable on PATH (Debian names it ``chromium``), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class BrowserError(RuntimeError):
    """The browser did not start, a page did not load, or a wait timed out."""


class Browser:
    """One headless Chromium with one page; use as a context manager."""

    def __init__(self, executable: str, *, width: int = 1600, height: int = 1200) -> None:
        self._profile = Path(tempfile.mkdtemp(prefix="gymtrace-chromium-"))
        # A file, not a pipe: Chromium logs freely and a full pipe would stall it.
        self._log = self._profile.with_suffix(".log")
        self._log_file = open(self._log, "wb")  # noqa: SIM115  (closed in close())
        self._process = subprocess.Popen(
            [
                executable,
                "--headless=new",
                # Containers run the tests as root, where Chromium refuses its sandbox.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",  # a free port, written to DevToolsActivePort
                f"--user-data-dir={self._profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log_file,
        )
        self._ids = itertools.count(1)
        self._exit = contextlib.ExitStack()
        try:
            self._ws = self._connect_page(timeout=30)
        except BaseException:
            self.close()
            raise
        self.call("Page.enable")
        self.call("Runtime.enable")

    def _connect_page(self, timeout: float) -> ClientConnection:
        port_file = self._profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not port_file.exists() or not port_file.read_text().strip():
            if self._process.poll() is not None:
                err = self._log.read_text(errors="replace")
                raise BrowserError(f"chromium exited with {self._process.returncode}: {err[-2000:]}")
            if time.monotonic() > deadline:
                raise BrowserError("chromium did not open its DevTools port in time")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as resp:
            targets = json.load(resp)
        page = next(t for t in targets if t.get("type") == "page")
        # Entered here and exited in close(): the connection lives as long as this object.
        return self._exit.enter_context(
            connect(page["webSocketDebuggerUrl"], max_size=64 * 1024 * 1024, open_timeout=10)
        )

    @property
    def pid(self) -> int:
        """The browser's process (its renderers and helpers are its children)."""
        return self._process.pid

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and return its result (events in between are skipped)."""
        message_id = next(self._ids)
        self._ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self._ws.recv(timeout=60))
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable values only)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:200]}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def wait_for(self, expression: str, *, timeout: float = 30.0, what: str = "") -> Any:
        """Poll a JavaScript expression until it is truthy; its value. BrowserError after timeout."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(BrowserError):
                value = self.evaluate(expression)
                if value:
                    return value
            if time.monotonic() > deadline:
                text = self.evaluate("document.body ? document.body.innerText.slice(0, 1500) : ''")
                raise BrowserError(f"timed out waiting for {what or expression!r}; page text:\n{text}")
            time.sleep(0.2)

    def screenshot(self, path: Path) -> Path:
        """Save the whole page as a PNG."""
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._exit.close()
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
        self._log_file.close()
        self._log.unlink(missing_ok=True)
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
