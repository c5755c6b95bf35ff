"""Load an HTML file in headless Chromium and collect console errors, over the DevTools protocol.

`--dump-dom` alone cannot see console messages in new headless mode, so this speaks CDP over
`--remote-debugging-pipe` (fd 3 in, fd 4 out, NUL-separated JSON): stdlib only, no websocket
library, no open port. It reports console.error/warn calls, uncaught exceptions, failed resource
loads (Log domain), and a few facts from the page itself (images decoded, headings).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any


def chromium_binary() -> str | None:
    """The first Chromium/Chrome on PATH, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


class _Pipe:
    def __init__(self, binary: str, profile: str) -> None:
        to_child_r, self._to_child_w = os.pipe()
        self._from_child_r, from_child_w = os.pipe()

        def _fds() -> None:  # in the child: the protocol fds must be 3 and 4 (move out of the way first)
            hi_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
            hi_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        self.proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-extensions",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_fds,  # runs before exec; dup2'd fds 3 and 4 are inheritable, the rest close on exec
            close_fds=False,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child_w, json.dumps(msg).encode() + b"\0")
        return self._next

    def _read(self, deadline: float) -> dict[str, Any] | None:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._from_child_r], [], [], left)
            if not ready:
                return None
            chunk = os.read(self._from_child_r, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None, timeout: float = 20):
        mid = self.send(method, params, session)
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read(deadline)
            if msg is None:
                raise TimeoutError(f"no reply to {method}")
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_event(self, method: str, timeout: float = 20) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        while True:
            msg = self._read(deadline)
            if msg is None:
                return None
            self.events.append(msg)
            if msg.get("method") == method:
                return msg

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (msg := self._read(deadline)) is not None:
            self.events.append(msg)

    def close(self) -> None:
        try:
            self.send("Browser.close")
            self.proc.wait(timeout=10)
        except Exception:
            self.proc.kill()
            self.proc.wait(timeout=10)
        finally:
            os.close(self._to_child_w)
            os.close(self._from_child_r)


VIEWPORT = (1280, 800)  # a laptop screen, CSS pixels: the "first screens" are measured in its height


def load_page(binary: str, html_file: Path, timeout: float = 30) -> dict[str, Any]:
    """Open `html_file` in a VIEWPORT window; return {'errors': [...], 'images': n, 'broken_images': n,
    'h2': n, 'title': str, 'scripts': n, 'first_image_top': px, 'page_height': px, 'literal_backticks':
    [text of elements whose rendered text shows a backtick]}."""
    with tempfile.TemporaryDirectory(prefix="tpplan-chromium-") as profile:
        pipe = _Pipe(binary, profile)
        try:
            target = pipe.call("Target.createTarget", {"url": "about:blank"}, timeout=timeout)["targetId"]
            session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime.enable", "Log.enable", "Page.enable"):
                pipe.call(domain, session=session)
            metrics = {"width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1, "mobile": False}
            pipe.call("Emulation.setDeviceMetricsOverride", metrics, session=session)
            pipe.call("Page.navigate", {"url": html_file.resolve().as_uri()}, session=session)
            if pipe.wait_event("Page.loadEventFired", timeout) is None:
                raise TimeoutError(f"{html_file} did not finish loading in {timeout} s")
            pipe.drain(0.3)
            expr = (
                "JSON.stringify({images: document.images.length,"
                " broken_images: Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).length,"
                " h2: document.querySelectorAll('h2').length, title: document.title,"
                " scripts: document.scripts.length,"
                " first_image_top: document.images.length ? document.images[0].getBoundingClientRect().top : -1,"
                " page_height: document.documentElement.scrollHeight,"
                " literal_backticks: Array.from(document.querySelectorAll('strong, h1, h2, h3, p, li, td'))"
                ".filter(e => e.innerText.includes('`')).map(e => e.innerText.slice(0, 80))})"
            )
            res = pipe.call("Runtime.evaluate", {"expression": expr, "returnByValue": True}, session=session)
            facts = json.loads(res["result"]["value"])
        finally:
            pipe.close()
    errors = []
    for ev in pipe.events:
        m, p = ev.get("method"), ev.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
            errors.append(f"console.{p['type']}: " + " ".join(str(a.get("value", a)) for a in p.get("args", [])))
        elif m == "Runtime.exceptionThrown":
            errors.append("exception: " + p.get("exceptionDetails", {}).get("text", "?"))
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
            entry = p["entry"]
            errors.append(f"log.{entry['level']} ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}")
    return {"errors": errors, **facts}
