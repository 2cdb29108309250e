"""The worker processes ampgraph forks: how many to start, and that they end with their parent.

Torch-free, so the analysis (settings in forked workers, the check beside the annotation) and
the renderer (one ``dot`` process per core) count cores the same way.

>>> default_workers() >= 1
True
"""

from __future__ import annotations

import os
import sys


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
