"""What a model's own code may not do to the command that analyses it: write on the command's
standard output, end the command's process, or keep it waiting forever.

A ``--module`` factory, the module it lives in, the model's ``forward`` (traced, replayed by the
check, run for real by ``verify``) and whatever they import run inside ampgraph's processes. A
``print`` there came out ahead of ``ampgraph table --format json``'s report (invalid JSON, exit
status 0), an ``os._exit(0)`` ended the command with status 0 and no output, and a ``forward``
that never returned hung the command with no bound. :func:`model_code` is the block that code
runs in: its output goes to standard error (:func:`output_to_stderr`), ``os._exit`` is an error
(:func:`exit_refused`), and ``sys.exit`` or ``KeyboardInterrupt`` one line (:func:`exit_error`).
The time bound is not here: a deadline inside the process can be caught or overridden by the
model's own code, so the command runs the analysis in a process group it kills
(:mod:`ampgraph.pipeline.workers`); :func:`deadline` is a best-effort bound for a call that
stays in the caller's process.

Torch-free: the command line enters these blocks before torch is imported.

>>> import io, contextlib
>>> caught = io.StringIO()
>>> with contextlib.redirect_stderr(caught), output_to_stderr():
...     print("from the model")
>>> caught.getvalue()
'from the model\\n'
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any, NoReturn

import ampgraph.arguments as arguments
from ampgraph.errors import AnalysisError

#: The bound ``--timeout`` puts on an analysis by default, in seconds: far above what a bundled
#: model takes (on the 2-core machine of docs/how-it-works.md, a cold render of the Llama-3-70B
#: shape took 11 s and its training step 45 s), far below "forever".
DEFAULT_TIMEOUT: float = 600
#: The bounds a timeout must lie within (0 aside, which means none): below a second no cold
#: analysis finishes (importing torch alone takes longer), and above a week a bound is a typo
#: (``1e7``), or more than a clock can wait for (``1e308``, ``inf``).
MIN_TIMEOUT: float = arguments.MIN_TIMEOUT
MAX_TIMEOUT: float = arguments.MAX_TIMEOUT


def parse_timeout(value: str | float) -> float | None:
    """A timeout in seconds as ``--timeout`` and the directive's ``:timeout:`` take it: None for
    0 (no bound), else a number from :data:`MIN_TIMEOUT` to :data:`MAX_TIMEOUT`. A ValueError
    in one line says what is accepted.

    >>> parse_timeout("90"), parse_timeout("0")
    (90.0, None)
    >>> parse_timeout("nan")
    Traceback (most recent call last):
    ValueError: 'nan' is not a number of seconds: give 0 (no bound) or 1 to 604800 (a week)
    """
    text = str(value).strip()
    accepted = f"give 0 (no bound) or {MIN_TIMEOUT:g} to {MAX_TIMEOUT:g} (a week)"
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    shown = text if len(text) <= 40 else text[:40] + "..."
    if seconds != seconds:  # nan, and what is no number at all
        raise ValueError(f"{shown!r} is not a number of seconds: {accepted}")
    if seconds == 0:
        return None
    if not MIN_TIMEOUT <= seconds <= MAX_TIMEOUT:
        raise ValueError(f"{shown} seconds is out of range: {accepted}")
    return seconds


def overdue_message(seconds: float) -> str:
    """The one-line error of an analysis stopped at its deadline.

    >>> overdue_message(2.0).split(";")[0]
    'the analysis did not finish within 2 s (a forward that never returns?)'
    """
    return (
        f"the analysis did not finish within {seconds:g} s (a forward that never returns?); "
        "raise --timeout or check the model"
    )


# -- standard output --------------------------------------------------------------------------


def _flush_output() -> None:
    """Write out what Python and C have buffered for fds 1 and 2, so that it lands where the
    fds point now, not where they will point after the next :func:`os.dup2`."""
    for stream in {id(s): s for s in (sys.stdout, sys.__stdout__, sys.stderr) if s}.values():
        with contextlib.suppress(Exception):  # a closed or foreign stream: nothing to keep
            stream.flush()
    # C's stdio (a C extension's printf, C++'s std::cout) buffers on its own, in blocks when
    # fd 1 is a pipe.
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def output_to_stderr() -> Iterator[None]:
    """Send everything written to standard output during the block to standard error.

    Both levels: Python's ``sys.stdout`` (``print``) is :data:`sys.stderr` in the block, and fd 1
    is a copy of fd 2, for C extensions, code that kept a reference to the old ``sys.stdout`` and
    processes forked in the block (the analysis's workers inherit the fds they were forked with).
    What the command wrote before the block is flushed to the real standard output first; at
    the end, what was buffered in the block is flushed to standard error, then fd 1 is restored,
    so the command's own output after the block reaches the real standard output. Where fd 1 or 2
    is not open, only ``sys.stdout`` is redirected. Blocks nest. Process-wide, as fds are: what
    other threads print meanwhile goes to standard error too.
    """
    _flush_output()
    saved: int | None
    try:
        saved = os.dup(1)
    except OSError:  # fd 1 is closed: nothing to protect at the fd level
        saved = None
    else:
        try:
            os.dup2(2, 1)
        except OSError:  # no fd 2 to send it to: leave fd 1 as it is
            os.close(saved)
            saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _flush_output()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


# -- os._exit ---------------------------------------------------------------------------------


class ModelExited(AnalysisError):
    """The model's code called ``os._exit``: the process would have ended without a result."""


#: Modules whose ``os._exit`` is a process's ordinary end, not the model's: a forked worker's
#: (multiprocessing ends each with it) and ampgraph's own (workers.run_in_fork, cli.exit_now).
_OWN_EXITS = ("multiprocessing.", "concurrent.", "ampgraph.")
_real_exit = os._exit
#: How many :func:`exit_refused` blocks are open in any thread (forked children inherit it), so
#: that ``os._exit`` is the replacement exactly while one is, whatever order threads leave in.
_OPEN = [0]
_LOCK = threading.Lock()


def _refusing_exit(code: int) -> NoReturn:
    """``os._exit`` while :func:`exit_refused` is open: raises :class:`ModelExited` when the
    model's code calls it, ends the process when one of :data:`_OWN_EXITS` does."""
    frame: FrameType | None = sys._getframe(1)
    caller = frame.f_globals.get("__name__", "") if frame is not None else ""
    if not _OPEN[0] or str(caller).startswith(_OWN_EXITS):  # a reference kept past the block
        _real_exit(code)
    where = f" at {frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""
    raise ModelExited(
        f"the model's code called os._exit({code!r}){where}, which would end ampgraph without "
        "a result: a factory must return (module, example_inputs), and a forward its outputs"
    )


@contextlib.contextmanager
def exit_refused() -> Iterator[None]:
    """Make ``os._exit`` called by the model's code in the block a :class:`ModelExited` error.

    ``sys.exit`` raises, so the loader turns it into an error already; ``os._exit`` ends the
    process at once, with the status the model's code chose: ``os._exit(0)`` in a factory ended
    ``ampgraph table`` with status 0 and no output. Nothing in-process can catch that, so
    ``os._exit`` itself is replaced for the block. Processes forked in the block (the analysis's
    workers, which trace the model in each setting) inherit the replacement; their own ends,
    multiprocessing's ``os._exit`` calls, still end them. Code that kept its own reference to
    ``os._exit``, or ends the process otherwise (a signal, C's ``exit``), is not caught here:
    an analysis process or worker that ends so is an error in its parent instead
    (:func:`ampgraph.pipeline.workers.run_in_fork`, the timeout of :func:`deadline`).
    """
    with _LOCK:
        _OPEN[0] += 1
        os._exit = _refusing_exit
    try:
        yield
    finally:
        with _LOCK:
            _OPEN[0] -= 1
            if not _OPEN[0]:
                os._exit = _real_exit


# -- the deadline -----------------------------------------------------------------------------


class _Overdue(BaseException):
    """Raised by the alarm in :func:`deadline`'s block. A BaseException, so that neither the
    model's ``except Exception`` nor the loader's (which turns a factory's exceptions into
    one-line errors) takes it for an error of the model's own."""


def _alarm(signum: int, frame: Any) -> None:
    raise _Overdue


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """End the block with an :class:`~ampgraph.errors.AnalysisError` (:func:`overdue_message`)
    after ``seconds``; None or 0: no bound.

    A SIGALRM interrupts the block wherever Python code runs or waits (a ``time.sleep``, a
    ``while True``, a wait for the analysis's workers, which are then stopped as the error
    unwinds); a single C call that never returns is not interrupted. Only in the main thread,
    where Python runs signal handlers, and only where no other alarm is set (an outer deadline,
    a test runner's timeout), which keeps its own; elsewhere the block runs unbounded. The
    previous handler is restored at the end.

    >>> with deadline(5):
    ...     "done in time"
    'done in time'
    """
    import signal

    if (
        not seconds
        or not hasattr(signal, "setitimer")
        or threading.current_thread() is not threading.main_thread()
        or signal.getitimer(signal.ITIMER_REAL)[0] > 0
    ):
        yield
        return
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _Overdue:
        raise AnalysisError(overdue_message(seconds)) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def model_code() -> Iterator[None]:
    """A block that runs the model's own code: its output on standard error, its ``os._exit``
    and ``sys.exit`` (a ``SystemExit`` out of a forward) errors. Unbounded: the deadline is the
    caller's, around all of its work (:func:`ampgraph.pipeline.workers.run_in_fork`'s
    ``timeout`` for a process group beside it, which holds; :func:`deadline` in-process, which
    may not).

    >>> try:
    ...     with model_code():
    ...         raise SystemExit(0)
    ... except ModelExited as exc:
    ...     str(exc).split(",")[0]
    "the model's code called sys.exit(0)"
    """
    with output_to_stderr(), exit_refused():
        try:
            yield
        except SystemExit as exc:
            raise exit_error(exc) from None


def exit_error(exc: SystemExit | KeyboardInterrupt) -> ModelExited:
    """The error a ``SystemExit`` or ``KeyboardInterrupt`` raised by the model's code is, where
    it must not end the process (a worker, whose task would be lost, or ampgraph itself). A
    KeyboardInterrupt only where Ctrl-C is ignored: elsewhere a person may have pressed it.

    >>> str(exit_error(SystemExit(3))).split(",")[0]
    "the model's code called sys.exit(3)"
    """
    if isinstance(exc, KeyboardInterrupt):
        return ModelExited(
            "the model's code raised KeyboardInterrupt (nobody pressed Ctrl-C: the analysis "
            "ignores it), which would end ampgraph without a result"
        )
    return ModelExited(
        f"the model's code called sys.exit({exc.code!r}), which would end ampgraph without a "
        "result: a factory must return (module, example_inputs), and a forward its outputs"
    )


__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_TIMEOUT",
    "MIN_TIMEOUT",
    "ModelExited",
    "deadline",
    "exit_error",
    "exit_refused",
    "model_code",
    "output_to_stderr",
    "overdue_message",
    "parse_timeout",
]
