"""Progress on a terminal: one line on stderr naming the stage and its elapsed time.

A command that takes seconds (a cold analysis, ``verify``, the Llama-3-70B shape) says what it
is doing; one that answers from the cache says nothing. The line appears only after
:data:`DELAY` seconds, only when stderr is a terminal, and goes when the command ends
(``transient``), so that what is left on the screen is the command's answer and nothing else.
stdout is never touched: ``--format json`` and ``--format sarif`` stay parseable whatever a
terminal shows. Drawn by rich, which handles the terminal's width, colours and redraws.

>>> line = StageLine(enabled=False)
>>> line("building opt-125m")
>>> line.stage
'building opt-125m'
>>> line.close()
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

#: Seconds before the line appears: a warm run (the cache, ~0.3 s) never shows one.
DELAY = 1.0


class StageLine:
    """A transient stage line with the elapsed time, on ``stream`` (stderr) when it is a terminal.

    Call it with each stage's name (it is a :data:`ampgraph.pipeline.run.Progress`); close it,
    or use it as a context manager, when the command is done. ``enabled`` overrides the
    terminal test (``--quiet`` passes False).
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        enabled: bool | None = None,
        delay: float = DELAY,
        started: float | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _is_terminal(self.stream) if enabled is None else enabled
        self.delay = delay
        self.stage = ""
        # When the work began (time.monotonic()): the delay and the elapsed time count from it.
        self.started = time.monotonic() if started is None else started
        self._lock = threading.Lock()
        self._live: Any = None
        self._task: Any = None
        self._timer: threading.Timer | None = None
        self._closed = False

    def __call__(self, message: str) -> None:
        self.set(message)

    def set(self, message: str) -> None:
        """Name the stage now running (shown at once if the line is up, else after the delay)."""
        self.stage = message.strip().rstrip(".").rstrip("…")
        if not self.enabled:
            return
        with self._lock:
            if self._closed:
                return
            if self._live is not None:
                self._live.update(self._task, description=self.stage)
            elif self._timer is None:
                wait = max(0.0, self.delay - (time.monotonic() - self.started))
                self._timer = threading.Timer(wait, self._show)
                self._timer.daemon = True
                self._timer.start()

    def _show(self) -> None:
        # rich is imported here, on a terminal after a second's work: a warm run never pays it.
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with self._lock:
            if self._closed:
                return
            self._live = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=Console(file=self.stream),
                transient=True,
                # Never wrap sys.stdout: a command's output is its own, whatever the terminal shows.
                redirect_stdout=False,
                redirect_stderr=False,
            )
            # The elapsed time counts from the command's start, not from when the line appeared.
            self._task = self._live.add_task(self.stage, total=None)
            self._live.tasks[0].start_time = self._live.get_time() - (
                time.monotonic() - self.started
            )
            self._live.start()

    def close(self) -> None:
        """Take the line off the terminal (it leaves nothing behind)."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self._live is not None:
                self._live.stop()
                self._live = None

    def __enter__(self) -> StageLine:  # noqa: PYI034 (typing.Self needs Python 3.11)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


__all__ = ["DELAY", "StageLine"]
