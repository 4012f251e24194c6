"""A headless Chromium driven over the DevTools protocol (one page, one websocket): open a URL,
read the DOM with JavaScript, click and submit as a person would, take a screenshot. Tests of the
comparison pages and the docs' screenshots use it; Debian's `chromium` package, nothing
downloaded at run time."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from ..errors import UsageError

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--hide-scrollbars", "--remote-debugging-port=0")


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """``with Browser() as b: b.open(url); b.eval("document.title")``."""

    def __init__(self, width: int = 1280, height: int = 900, timeout_s: float = 60.0) -> None:
        exe = chromium_path()
        if exe is None:
            raise UsageError("headless Chromium is needed (Debian's `chromium` package: `make browser`)")
        self.timeout_s = timeout_s
        self._dir = tempfile.mkdtemp(prefix="evalkit-chromium-")
        self._proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={self._dir}", f"--window-size={width},{height}",
                                       "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._ids = itertools.count(1)
        self._ws: Any = None
        self._events: list[dict[str, Any]] = []

    def __enter__(self) -> Browser:
        from websockets.sync.client import connect

        port_file = Path(self._dir) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout_s
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self._proc.poll() is not None:
                self.close()
                raise UsageError("Chromium did not start its DevTools endpoint")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.loads(r.read()) if t.get("type") == "page")
        self._ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=self.timeout_s).__enter__()
        self.call("Page.enable")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._ws is not None:
            self._ws.close()
            self._ws = None
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; events that arrive meanwhile are kept for `wait_event`."""
        n = next(self._ids)
        self._ws.send(json.dumps({"id": n, "method": method, "params": params}))
        while True:
            msg = json.loads(self._ws.recv(timeout=self.timeout_s))
            if msg.get("id") == n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result") or {}
            self._events.append(msg)

    def wait_event(self, method: str) -> dict[str, Any]:
        for k, e in enumerate(self._events):
            if e.get("method") == method:
                return self._events.pop(k)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            msg = json.loads(self._ws.recv(timeout=self.timeout_s))
            if msg.get("method") == method:
                return msg
            self._events.append(msg)
        raise TimeoutError(f"no {method} within {self.timeout_s} s")

    def open(self, url: str) -> None:
        """Navigate and wait until the page has loaded."""
        self._events.clear()
        self.call("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def eval(self, expression: str) -> Any:
        """A JavaScript expression's value in the page."""
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression[:60]}: {r['exceptionDetails'].get('text')}")
        return (r.get("result") or {}).get("value")

    def submit(self, expression: str) -> None:
        """Run JavaScript that submits a form (or follows a link) and wait for the next page."""
        self._events.clear()
        self.eval(expression)
        self.wait_event("Page.loadEventFired")

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            m = self.call("Page.getLayoutMetrics")["cssContentSize"]
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": m["width"], "height": m["height"], "scale": 1})
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", **params)["data"]))
        return path
