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

import sys
from collections.abc import Callable
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

    run_in_fork(
        produce, take, expected, name=name, timeout=timeout,
        overdue=overdue_message(timeout) if timeout else "", group=True, counted=counted,
    )  # fmt: skip


__all__ = ["confine", "fork_is_safe"]
