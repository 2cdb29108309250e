"""A real headless Chromium for the documentation tests, driven over the DevTools protocol.

Stdlib only: Chromium's ``--remote-debugging-pipe`` speaks the protocol as NUL-terminated JSON on
file descriptors 3 (commands) and 4 (replies and events), so no websocket client or browser
automation package is needed. Pages are served over HTTP from a local thread, because a page
may only look inside an ``<object>``'s SVG document from the same origin (``file://`` URLs are
each their own origin).

    with Browser() as browser, serve(Path("docs/_build/html")) as base:
        browser.open(f"{base}/gallery.html", dark=True)
        print(browser.evaluate("document.title"))
        browser.screenshot(Path("/tmp/page.png"))
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

#: Debian's package installs ``chromium``; other systems name it otherwise.
CANDIDATES: Final = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

FLAGS: Final = (
    "--headless",
    "--no-sandbox",  # root in a container has no user namespace for the sandbox
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    """The path of a Chromium-family browser, or None."""
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


class BrowserError(RuntimeError):
    """The browser failed, or a protocol command returned an error."""


class Browser:
    """One headless Chromium with one page (a tab), commanded over the DevTools pipe."""

    def __init__(self, executable: str | None = None, *, timeout: float = 60.0) -> None:
        exe = executable or find_chromium()
        if exe is None:
            raise BrowserError("no Chromium found: apt-get install chromium")
        self.timeout = timeout
        # Pipes: we write commands into to_browser, read replies from from_browser.
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()

        def as_fds_3_and_4() -> None:  # in the child, before exec
            # Through fresh descriptors first: dup2(to_r, 3) would clobber from_w were it 3.
            read_end, write_end = os.dup(to_r), os.dup(from_w)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        self.profile = Path(os.environ.get("TMPDIR", "/tmp")) / f"ampgraph-chromium-{os.getpid()}"
        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            preexec_fn=as_fds_3_and_4,  # noqa: PLW1509 - only dup2, no locks taken
            pass_fds=(3, 4),  # kept open (and inheritable) through exec
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_r)
        os.close(from_w)
        self.writer = os.fdopen(to_w, "wb", buffering=0)
        self.reader = os.fdopen(from_r, "rb", buffering=0)
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        self.send("Page.enable", session=True)
        self.send("Runtime.enable", session=True)

    # -- protocol --------------------------------------------------------------------------------

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            if time.monotonic() > deadline:
                raise BrowserError("the browser did not answer in time")
            chunk = self.reader.read(65536)
            if not chunk:
                raise BrowserError("the browser closed its pipe (it crashed or was not started)")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, *, session: bool = False, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its reply; events that arrive meanwhile are kept."""
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        self.writer.write(json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for_event(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while True:
            for k, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(k)
            self.events.append(self._read_message(deadline))

    # -- what the tests use ----------------------------------------------------------------------

    def open(self, url: str, *, dark: bool = False, width: int = 1400, height: int = 1000) -> None:
        """Load ``url`` at a window size, with the reader's colour scheme dark or light."""
        self.send(
            "Emulation.setEmulatedMedia",
            session=True,
            features=[{"name": "prefers-color-scheme", "value": "dark" if dark else "light"}],
        )
        self.send(
            "Emulation.setDeviceMetricsOverride",
            session=True,
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        self.events.clear()
        self.send("Page.navigate", session=True, url=url)
        self.wait_for_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises are awaited)."""
        result = self.send(
            "Runtime.evaluate",
            session=True,
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise BrowserError(f"JavaScript failed: {text}")
        return result["result"].get("value")

    def screenshot(self, path: Path, *, full_page: bool = False) -> Path:
        """A PNG of the viewport (or of the whole page)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.evaluate(
                "[document.documentElement.scrollWidth, document.documentElement.scrollHeight]"
            )
            params.update(
                captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1},
            )
        data = self.send("Page.captureScreenshot", session=True, **params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send("Browser.close")
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.writer.close()
        self.reader.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def browser_or_skip(*, timeout: float = 60.0) -> Iterator[Browser]:
    """A :class:`Browser` for a test, which is skipped where no Chromium is installed, and fails
    there instead where ``AMPGRAPH_REQUIRE_BROWSER=1`` (a machine that must run the browser tests).
    """
    import pytest

    if find_chromium() is None:
        if os.environ.get("AMPGRAPH_REQUIRE_BROWSER") == "1":
            pytest.fail("Chromium is required here: apt-get install chromium")
        pytest.skip("no Chromium: apt-get install chromium")
    with Browser(timeout=timeout) as chromium:
        yield chromium


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve(folder: Path) -> Iterator[str]:
    """Serve ``folder`` over HTTP on a free local port, in a thread; yield its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
