"""Run a model's code where it cannot defeat the command that runs it: the one way ``ranges``
and ``verify`` run a model for real, as ``table`` analyses one (:func:`confine`).

Torch-free: the command must reach the fork without having imported torch, or the fork would
not be safe (see :func:`confine`).

>>> items = []
>>> confine(lambda send: [send(("progress", "a")), send(("result", 42))], items.append,
...         name="answer", timeout=60, counted=lambda item: item[0] == "result")
>>> items
[('progress', 'a'), ('result', 42)]
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any


def fork_is_safe() -> bool:
    """Whether this process may fork one that runs torch: it has not imported torch (a process
    whose OpenMP or autograd threads have run cannot run torch's kernels again in a fork: the
    child hangs on OpenMP's lost threads, or autograd refuses "fork-based multiprocessing"),
    and it may have children (a pool's daemonic worker may not).

    >>> isinstance(fork_is_safe(), bool)
    True
    """
    import multiprocessing as mp

    return (
        "torch" not in sys.modules
        and "fork" in mp.get_all_start_methods()
        and not mp.current_process().daemon
    )


def confine(
    produce: Callable[[Callable[[Any], None]], None],
    take: Callable[[Any], None],
    *,
    name: str,
    timeout: float | None,
    counted: Callable[[Any], bool],
    expected: int = 1,
) -> None:
    """``produce(send)``, which runs a model's own code, with each item it sends handed to
    ``take`` as it comes; it sends ``expected`` items for which ``counted`` is true (the
    results), and any number of others (progress notes) before them.

    Where :func:`fork_is_safe` (the command line: it imports torch in the fork only), in a
    process group of its own that this process kills after ``timeout`` seconds (None or 0: no
    bound) whatever the code does (:func:`ampgraph.pipeline.workers.run_in_fork` with
    ``group``): it swallows the alarm, ignores SIGTERM, kills itself, forks, prints from a
    thread or an ``atexit`` handler, or replaces ``json.dumps``: none of it reaches this
    process, its standard output or its exit status; each is one
    :class:`~ampgraph.errors.AnalysisError`. Elsewhere (a notebook or a test runner that has run
    torch already) here, under the best-effort alarm (:func:`ampgraph.model.usercode.deadline`).
    """
    from ampgraph.model.usercode import deadline, overdue_message

    if not fork_is_safe():
        with deadline(timeout):
            produce(take)
        return
    from ampgraph.pipeline.workers import run_in_fork

    with _orphans_killed():
        run_in_fork(
            produce, take, expected, name=name, timeout=timeout,
            overdue=overdue_message(timeout) if timeout else "", group=True, counted=counted,
        )  # fmt: skip


@contextlib.contextmanager
def _orphans_killed() -> Iterator[None]:
    """Kill, at the end of the block, the processes the model's code started that left its
    process group (``subprocess.Popen(..., start_new_session=True)``, a double fork and
    ``setsid``), which killing the group does not reach: on Linux this process adopts them as
    they are orphaned (``prctl(PR_SET_CHILD_SUBREAPER)``) and kills every child it did not
    have before the block. Elsewhere nothing is done. A process that escaped its parent before
    its parent died and was adopted is not found until the whole chain above it has ended, so
    the scan repeats for a moment."""
    import ctypes
    import signal
    import time

    if not sys.platform.startswith("linux"):
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    before = set(_children())
    adopted = libc.prctl(36, 1, 0, 0, 0) == 0  # 36: PR_SET_CHILD_SUBREAPER
    try:
        yield
    finally:
        if adopted:
            quiet = 0
            end = time.monotonic() + 2.0
            while quiet < 3 and time.monotonic() < end:
                strays = [pid for pid in _children() if pid not in before]
                quiet = 0 if strays else quiet + 1
                for pid in strays:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                    with contextlib.suppress(OSError):
                        os.waitpid(pid, 0)
                time.sleep(0.02)
            libc.prctl(36, 0, 0, 0, 0)


def _children() -> list[int]:
    """This process's children, as /proc lists them (field 4 of /proc/PID/stat: the parent)."""
    me, found = os.getpid(), []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            found.append(int(entry.name))
    return found


__all__ = ["confine", "fork_is_safe"]
