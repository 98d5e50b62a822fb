"""Load a page in a real headless Chromium and report what a user's browser would see.

Speaks the Chrome DevTools Protocol over ``--remote-debugging-pipe`` (JSON messages separated by NUL
bytes on file descriptors 3 and 4), so no websocket client and no port are needed. Collects every
console message of level error or warning, uncaught exceptions and log entries (failed loads), then
reads the images of the loaded page.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def find_browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


class _Pipe:
    def __init__(self, browser: str, profile: str):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def child_fds():  # the browser reads commands on fd 3 and writes replies on fd 4
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser_r, from_browser_w)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [
                browser,
                "--headless",
                "--disable-gpu",
                "--no-sandbox",
                "--no-first-run",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=child_fds,
            close_fds=False,  # keeps 3 and 4 (dup2 makes them inheritable; os.pipe's own fds are not)
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        """Send a command; return its result (events that arrive meanwhile go to ``events``)."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read(timeout)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 60) -> dict:
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            event = self._read(timeout)
            self.events.append(event)
            if event.get("method") == method:
                return event

    def _read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no reply from the browser")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("the browser closed its pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.send("Browser.close", timeout=10)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


def _problems(events: list[dict]) -> list[str]:
    said = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            said.append(f"exception: {details.get('exception', {}).get('description') or details.get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
            said.append(f"console.{params['type']}: " + " ".join(str(a.get("value")) for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"].get("level") in ("error", "warning"):
            said.append(f"log {params['entry']['level']}: {params['entry'].get('text')}")
    return said


def load_page(path: str, browser: str, timeout: float = 60) -> dict:
    """Open the file ``path`` in headless ``browser``; return ``{"problems": [console errors,
    warnings, uncaught exceptions, failed loads], "images": [{"complete", "width", "height"}],
    "title"}`` once the load event has fired.
    """
    with tempfile.TemporaryDirectory() as profile:
        pipe = _Pipe(browser, profile)
        try:
            page = next(t for t in pipe.send("Target.getTargets")["targetInfos"] if t["type"] == "page")
            session = pipe.send("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                pipe.send(f"{domain}.enable", session=session)
            pipe.send("Page.navigate", {"url": "file://" + os.path.abspath(path)}, session=session)
            pipe.wait_for("Page.loadEventFired", timeout)
            found = pipe.send(
                "Runtime.evaluate",
                {
                    "expression": "JSON.stringify({title: document.title, images: [...document.images].map("
                    "i => ({complete: i.complete, width: i.naturalWidth, height: i.naturalHeight}))})",
                    "returnByValue": True,
                },
                session=session,
            )["result"]["value"]
            return {**json.loads(found), "problems": _problems(pipe.events)}
        finally:
            pipe.close()
