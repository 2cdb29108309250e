"""The worker processes ampgraph forks: how many to start, that they end with their parent, and
one process's work beside the caller's (:func:`beside`).

Torch-free, so the analysis (settings in forked workers, the check beside the annotation, the
analysis beside a command) and the renderer (one ``dot`` process per core) count cores the same
way.

>>> default_workers() >= 1
True
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from typing import Any


def die_with_parent(parent: int) -> None:
    """Make a forked worker end when the process that started it ends, however it ends.

    Without it, killing ``ampgraph render`` (SIGTERM, SIGKILL, a closed terminal) left its workers
    computing, then printing BrokenPipeError tracebacks. Linux delivers SIGTERM to the child when
    its parent dies (``prctl(PR_SET_PDEATHSIG)``); a parent that died before the call is caught by
    the ``getppid`` check.

    Ctrl-C is left to the parent: a terminal sends SIGINT to every process of the command, and
    each worker printed a ``Process ForkPoolWorker-1:`` traceback for it. The worker ignores it;
    the parent stops its workers as it unwinds (``Pool.terminate``, or the SIGTERM above).
    """
    import ctypes
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(1)


def default_workers() -> int:
    """One worker per core the process may use (its CPU affinity, where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def beside(
    produce: Callable[[Callable[[Any], None]], None],
    take: Callable[[Any], None],
    expected: int,
    meanwhile: Callable[[], Any] | None = None,
    *,
    name: str,
    hint: str = "",
    timeout: float | None = None,
    overdue: str = "",
) -> Any:
    """Run ``produce(send)`` in a forked process and ``meanwhile()`` here at the same time, then
    ``take`` each of the ``expected`` items ``produce`` sends, as it sends it; return what
    ``meanwhile`` returned.

    Returns with the last item, not when the process has ended: whatever it does after (its own
    workers' teardown) is no part of the caller's wait. An error there is raised here as it was
    raised there, with its traceback as a note for a bug (:func:`portable`); a process that ends
    without a word (killed, out of memory, an ``os._exit`` even with status 0) is an
    :class:`~ampgraph.errors.AnalysisError` naming the ``name`` process, followed by ``hint``.
    So is a process that has not sent every item ``timeout`` seconds after the start (None or 0:
    no bound), with the message ``overdue``. When this raises, the process is stopped.

    The process never writes on the caller's standard output: its fd 1 and ``sys.stdout`` are
    standard error for its whole life (and its own forked workers inherit that), so what the
    code it runs prints cannot come out ahead of what the caller prints.

    >>> items = []
    >>> beside(lambda send: [send(n * n) for n in range(3)], items.append, 3, lambda: "here",
    ...        name="squares")
    'here'
    >>> items
    [0, 1, 4]
    """
    import multiprocessing as mp

    from ampgraph.errors import AnalysisError

    ctx = mp.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    parent = os.getpid()

    def child() -> None:
        die_with_parent(parent)
        # Standard output is the caller's; anything this process prints is a diagnostic.
        with contextlib.suppress(OSError):
            os.dup2(2, 1)
        sys.stdout = sys.stderr
        code = 0
        try:
            produce(lambda item: send.send((False, item)))
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller
            code = 1
            with contextlib.suppress(BaseException):
                send.send((True, portable(exc, name)))
        finally:
            send.close()
        # Without the interpreter's teardown (of torch, where it has it: see
        # ampgraph.cli.exit_now): what it had to say is sent.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed pipe: nothing is left to say
                stream.flush()
        os._exit(code)

    process = ctx.Process(target=child, name=f"ampgraph-{name.replace(' ', '-')}")
    received = 0
    # What the caller has printed but not written yet would be copied into the child's buffer.
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    end = time.monotonic() + timeout if timeout else None
    try:
        process.start()  # in the try: a Ctrl-C just after the fork still stops the child
        send.close()
        result = meanwhile() if meanwhile is not None else None
        while received < expected:
            if end is not None and not receive.poll(max(0.0, end - time.monotonic())):
                raise AnalysisError(
                    overdue or f"the {name} process did not finish within {timeout:g} s{hint}"
                )
            try:
                failed, item = receive.recv()
            except EOFError:
                process.join()
                raise AnalysisError(
                    f"the {name} process ended without a result (exit code {process.exitcode}"
                    f"{', killed: out of memory?' if process.exitcode == -9 else ''}){hint}"
                ) from None
            if failed:
                raise item
            take(item)
            received += 1
    finally:
        receive.close()
        # An error, or the caller's meanwhile failed or was interrupted: the child ignores
        # Ctrl-C (die_with_parent), so it is stopped, not waited for.
        if received < expected and process.pid is not None:
            process.terminate()
            process.join()
    return result


def portable(exc: BaseException, name: str) -> BaseException:
    """``exc`` as it can cross from the ``name`` process to its parent: itself where it pickles,
    with its traceback there as a note where it is a bug; else a RuntimeError that says what it
    was."""
    import pickle
    import traceback

    from ampgraph.errors import AmpgraphError

    if not isinstance(exc, (AmpgraphError, KeyboardInterrupt)) and hasattr(exc, "add_note"):
        text = "".join(traceback.format_exception(exc)).rstrip()
        exc.add_note(f"in the {name} process:\n{text}")
    try:
        return pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - an exception that does not survive pickling
        return RuntimeError(f"{type(exc).__name__}: {exc}")
