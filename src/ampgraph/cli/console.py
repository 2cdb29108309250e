"""How the command line meets its process: one-line errors, progress notes and a quick exit.

Errors a user can fix (:class:`~ampgraph.errors.AmpgraphError`) become one ``Error: ...`` line
and exit status 1 (:class:`AmpgraphGroup`); :func:`progress` is the one place a command's progress
notes are written; :func:`write_output` writes a command's output in its format;
:func:`exit_now` ends a process that loaded torch without the interpreter's
teardown.
"""

from __future__ import annotations

import sys
import time
from typing import Any, NoReturn

import click

from ampgraph.errors import AmpgraphError
from ampgraph.pipeline.progress import StageLine


class AmpgraphGroup(click.Group):
    """Turn AmpgraphError into a one-line ``Error:`` message with exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        global _STARTED
        _STARTED = time.monotonic()  # the stage line's time counts from the command's start
        try:
            return super().invoke(ctx)
        except AmpgraphError as exc:
            raise click.ClickException(str(exc)) from None
        finally:
            progress_done()


#: The command's stage line while one is up (one per process: a command runs once).
_LINE: StageLine | None = None
#: When the command started (:meth:`AmpgraphGroup.invoke`): a stage line put up again after
#: output counts from here too.
_STARTED = time.monotonic()


def quiet() -> bool:
    """Whether the command was given ``--quiet`` (before or after the command's name)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return False
    root = ctx.find_root().obj
    return bool(ctx.params.get("quiet") or (isinstance(root, dict) and root.get("quiet")))


def progress(message: str) -> None:
    """Name the stage the command is in: a transient line on stderr with the elapsed time
    (:class:`~ampgraph.pipeline.progress.StageLine`), after a second, on a terminal, without
    ``--quiet``; nothing otherwise.

    >>> progress("building opt-125m")  # stderr is no terminal here: nothing is written
    >>> progress_done()
    """
    global _LINE
    if _LINE is None:
        _LINE = StageLine(enabled=False if quiet() else None, started=_STARTED)
    _LINE(message)


def progress_done() -> None:
    """Take the stage line down before the command writes its answer (and when it ends):
    stdout and the line share the terminal, and a redraw would erase what was printed."""
    global _LINE
    if _LINE is not None:
        _LINE.close()
        _LINE = None


def write_output(kind: str, fmt: str, result: Any, **options: Any) -> None:
    """``result``, a ``kind`` of :mod:`ampgraph.formats.registry`, in ``fmt`` on standard output
    (through click, as every command line write), its warning line, where it has one, on
    standard error: what each command ends with."""
    from ampgraph.formats import registry

    click.echo(registry.text(kind, fmt, result, **options), nl=False)
    line = registry.warning(kind, fmt, result, **options)
    if line is not None:
        click.echo(line, err=True)


def stdout_closed() -> bool:
    """Whether this process has no standard output to write to: fd 1 closed when it started.

    >>> stdout_closed()
    False
    """
    import os

    if sys.stdout is None:  # what Python makes of a closed fd 1 at startup
        return True
    try:
        os.fstat(1)
    except OSError:
        return True
    return False


def exit_now(code: int | str | None = 0) -> NoReturn:
    """End the process with ``code`` (as :func:`sys.exit` reads it) once its work is done.

    After torch and transformers are loaded, the interpreter's teardown frees every module and
    object they made, one by one: 1.3 s of a 7.7 s cold ``ampgraph render -s amp-fp32`` on the
    2-core machine, for nothing the command needs. What a normal exit does that matters still
    happens here: the exit handlers run (logging's flush, temporary folders' removal, anything
    registered with :mod:`atexit`) and both output streams are flushed; then ``os._exit`` skips
    the rest. Every file ampgraph writes is closed when its ``with`` block ends, and the worker
    pool has ended before a command returns.
    """
    import atexit
    import os

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): the message on stderr, status 1
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            # What CPython's own exit gives when the last flush fails.
            status = status or 120
    os._exit(status)
