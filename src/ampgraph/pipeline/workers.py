"""The worker processes ampgraph forks: how many to start, that they end with their parent, and
one process's work beside the caller's (:func:`run_in_fork`).

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
from collections.abc import Callable, Iterator
from typing import Any


def die_with_parent(parent: int, signum: int | None = None) -> None:
    """Make a forked worker end when the process that started it ends, however it ends.

    Without it, killing ``ampgraph render`` (SIGTERM, SIGKILL, a closed terminal) left its workers
    computing, then printing BrokenPipeError tracebacks. Linux delivers ``signum`` (default
    SIGTERM; SIGKILL for a process that runs a model's code, which may ignore SIGTERM) to the
    child when its parent dies (``prctl(PR_SET_PDEATHSIG)``); a parent that died before the call
    is caught by the ``getppid`` check.

    Ctrl-C is left to the parent: a terminal sends SIGINT to every process of the command, and
    each worker printed a ``Process ForkPoolWorker-1:`` traceback for it. The worker ignores it;
    the parent stops its workers as it unwinds (``Pool.terminate``, or the SIGTERM above).
    """
    import ctypes
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)

    if sys.platform.startswith("linux"):
        try:
            # 1: PR_SET_PDEATHSIG
            ctypes.CDLL(None, use_errno=True).prctl(1, signum or signal.SIGTERM)
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


def run_in_fork(
    produce: Callable[[Callable[[Any], None]], None],
    take: Callable[[Any], None],
    expected: int,
    meanwhile: Callable[[], Any] | None = None,
    *,
    name: str,
    hint: str = "",
    timeout: float | None = None,
    overdue: str = "",
    group: bool = False,
    counted: Callable[[Any], bool] | None = None,
) -> Any:
    """Run ``produce(send)`` in a forked process and ``meanwhile()`` here at the same time, then
    ``take`` each of the ``expected`` items ``produce`` sends, as it sends it; return what
    ``meanwhile`` returned.

    Returns with the last item, not when the process has ended: whatever it does after (its own
    workers' teardown) is no part of the caller's wait. An error there is raised here as it was
    raised there, with its traceback as a note for a bug (:func:`portable`); a ``SystemExit`` or
    ``KeyboardInterrupt`` there (the process ignores Ctrl-C, so the code it runs raised it) is an
    :class:`~ampgraph.errors.AnalysisError`. A process that ends without a word (killed, out of
    memory, an ``os._exit`` even with status 0) is an AnalysisError naming the ``name`` process,
    followed by ``hint``. So is a process that has not sent every item ``timeout`` seconds after
    the start (None or 0: no bound), with the message ``overdue``. When this raises, the process
    is stopped. ``counted`` (default: every item) says which items count towards ``expected``;
    the others (progress notes) may come in any number before the last counted one.

    The process never writes on the caller's standard output: its fd 1 and ``sys.stdout`` are
    standard error for its whole life (and its own forked workers inherit that), so what the
    code it runs prints cannot come out ahead of what the caller prints.

    ``group``: the process runs a model's own code, which may catch every exception, handle or
    ignore every signal, start threads and fork. It then leads a process group of its own (with
    its workers and whatever the code starts), and this ends by killing that whole group
    (:class:`Group`): at once after the last item, after a short SIGTERM grace on an error, the
    deadline, Ctrl-C, or a SIGTERM or SIGHUP to this process. So ``timeout`` holds whatever the
    code does, and no process outlives the call. Its standard input is ``/dev/null``; a fork in
    the code (not multiprocessing's, which ends on its own) is an AnalysisError that says where
    it forked, and the copy ends before it runs anything.

    >>> items = []
    >>> run_in_fork(lambda send: [send(n * n) for n in range(3)], items.append, 3, lambda: "here",
    ...        name="squares", group=True)
    'here'
    >>> items
    [0, 1, 4]
    """
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    parent = os.getpid()
    forks = Group.fork_notes() if group else None

    process = ctx.Process(
        target=_child, args=(produce, send, parent, name, forks),
        name=f"ampgraph-{name.replace(' ', '-')}",
    )  # fmt: skip
    # What the caller has printed but not written yet would be copied into the child's buffer.
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    wait = _Wait(process, receive, forks, name=name, hint=hint, timeout=timeout, overdue=overdue,
                 group=group, counted=counted)  # fmt: skip
    stopping = Group.signals_stop() if group else contextlib.nullcontext()
    try:
        with stopping:
            process.start()  # in the try: a Ctrl-C just after the fork still stops the child
            if group:
                Group.lead(process.pid)
            send.close()
            result = meanwhile() if meanwhile is not None else None
            wait.take_all(take, expected)
    finally:
        receive.close()
        wait.stop(expected)
    return result


class _Wait:
    """The caller's side of :func:`run_in_fork`: each item as the process sends it, the
    deadline, the process's end without a word, and stopping it."""

    def __init__(self, process: Any, receive: Any, forks: Any, *, name: str, hint: str,
                 timeout: float | None, overdue: str, group: bool,
                 counted: Callable[[Any], bool] | None = None) -> None:  # fmt: skip
        self.process, self.receive, self.forks = process, receive, forks
        self.counted = counted
        self.name, self.hint, self.timeout, self.overdue = name, hint, timeout, overdue
        self.group = group
        self.end = time.monotonic() + timeout if timeout else None
        self.received = 0
        self.ended = False

    def take_all(self, take: Callable[[Any], None], expected: int) -> None:
        """``take`` each of the ``expected`` items, as the process sends it."""
        from ampgraph.errors import AnalysisError

        while self.received < expected:
            left = None if self.end is None else max(0.0, self.end - time.monotonic())
            if left is not None and not self.receive.poll(left):
                Group.raise_forked(self.forks)
                raise AnalysisError(self.overdue or f"the {self.name} process did not finish "
                                    f"within {self.timeout:g} s{self.hint}")  # fmt: skip
            try:
                failed, item = self.receive.recv()
            except EOFError:
                self._ended_without_a_result()
            Group.raise_forked(self.forks)
            if failed:
                raise item
            take(item)
            self.received += self.counted is None or bool(self.counted(item))

    def _ended_without_a_result(self) -> None:
        from ampgraph.errors import AnalysisError

        process = self.process
        if self.group:  # before the leader is reaped, while its group's id is its own
            Group.end(process, finished=True)
            self.ended = True
        process.join()
        Group.raise_forked(self.forks)
        raise AnalysisError(
            f"the {self.name} process ended without a result ({_how_it_ended(process.exitcode)})"
            f"{self.hint}"
        ) from None

    def stop(self, expected: int) -> None:
        """End the process: its group killed (``group``), else stopped where it has not sent
        every item (an error, or the caller's meanwhile failed or was interrupted: the child
        ignores Ctrl-C, :func:`die_with_parent`, so it is stopped, not waited for)."""
        process = self.process
        if self.group and process.pid is not None:
            if not self.ended:
                Group.end(process, finished=self.received >= expected)
        elif self.received < expected and process.pid is not None:
            process.terminate()
            process.join()


def _how_it_ended(code: int | None) -> str:
    """A process's end in words: its exit code, or the signal that killed it (SIGKILL: the
    kernel's out-of-memory killer, or the model's own code killing its process).

    >>> _how_it_ended(-9)
    "killed by SIGKILL: out of memory, or the model's code killed its process"
    >>> _how_it_ended(0)
    'exit code 0'
    """
    import signal

    if code is None or code >= 0:
        return f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    why = ": out of memory, or the model's code killed its process" if code == -9 else ""
    return f"killed by {name}{why}"


def _child(
    produce: Callable[[Callable[[Any], None]], None], send: Any, parent: int, name: str,
    forks: Any,
) -> None:  # fmt: skip
    """The forked process of :func:`run_in_fork`: ``produce``, each item and the error (if any) sent
    to the parent, then the end, without the interpreter's teardown."""
    if forks is not None:
        Group.enter(parent, forks)
    else:
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
            send.send((True, portable(_as_error(exc, name), name)))
    finally:
        send.close()
    # Without the interpreter's teardown (of torch, where it has it: see
    # ampgraph.cli.exit_now): what it had to say is sent.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing is left to say
            stream.flush()
    _exit(code)


def isolated(
    work: Callable[[], Any], *, name: str, timeout: float | None = None, overdue: str = ""
) -> Any:
    """``work()`` run by :func:`run_in_fork` in a process group of its own, as model code is run:
    its result (which must pickle), or its error raised here; stopped after ``timeout``
    seconds (None or 0: no bound) with an AnalysisError saying ``overdue``.

    >>> isolated(lambda: 6 * 7, name="answer", timeout=60)
    42
    """
    results: list[Any] = []
    run_in_fork(
        lambda send: send(work()), results.append, 1, name=name, timeout=timeout,
        overdue=overdue, group=True,
    )  # fmt: skip
    return results[0]


def _as_error(exc: BaseException, name: str) -> BaseException:
    """What the ``name`` process raised, as its caller sees it: a ``SystemExit`` or
    ``KeyboardInterrupt`` (which the process's code raised: it ignores Ctrl-C) would end the
    caller with the code's own status, or as if a person pressed Ctrl-C."""
    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
        from ampgraph.model.usercode import exit_error

        return exit_error(exc)
    return exc


#: How long a process group that runs model code has, after SIGTERM, before SIGKILL.
GRACE_S = 0.5
#: Modules whose forks are ampgraph's, Python's or a library's process machinery, not a model
#: copying the process that analyses it (``os.fork`` in a forward).
_OWN_FORKS = ("multiprocessing.", "concurrent.", "ampgraph.", "subprocess")
_exit = os._exit  # os._exit itself: ampgraph.model.usercode.exit_refused replaces it


class Group:
    """The process group :func:`run_in_fork` runs model code in (``group=True``), both sides of it.

    Torch-free helpers, one job each: :meth:`enter` in the forked process, :meth:`lead` and
    :meth:`end` in its parent, :meth:`signals_stop` around the parent's wait, and the note a
    fork in the model's code leaves (:meth:`fork_notes`, :meth:`raise_forked`).
    """

    @staticmethod
    def fork_notes() -> Any:
        """Memory the process and its forks share with the parent: where the model's code
        forked, if it did (empty: it did not)."""
        import mmap

        return mmap.mmap(-1, 512)  # anonymous and shared: written there, read here

    @staticmethod
    def enter(parent: int, forks: Any) -> None:
        """In the forked process: lead a group of its own (which :meth:`end` kills), die with
        its parent even where it ignores SIGTERM, read nothing from the terminal, and end any
        copy the model's code forks before it runs, leaving a note of where it forked."""
        import signal

        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
        # The parent's handlers (signals_stop's) are not this process's. SIGTERM is the
        # default, as end() needs; SIGHUP too, unless the command was started with it ignored
        # (nohup): then the model's code, and what it starts, ignore a hangup as ampgraph does.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
            signal.signal(signal.SIGHUP, signal.SIG_DFL)
        die_with_parent(parent, signal.SIGKILL)
        with contextlib.suppress(OSError):
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)

        def forked() -> None:
            frame = sys._getframe(1)  # the caller of os.fork
            if str(frame.f_globals.get("__name__", "")).startswith(_OWN_FORKS):
                return
            note = f"{frame.f_code.co_filename}:{frame.f_lineno}".encode()[-500:]
            forks[: len(note)] = note
            _exit(0)

        os.register_at_fork(after_in_child=forked)

    @staticmethod
    def lead(pid: int) -> None:
        """In the parent, just after the fork: the child's group exists before anything may
        need to kill it (the child makes it too; whichever runs first wins)."""
        with contextlib.suppress(OSError):  # the child was first, or has ended already
            os.setpgid(pid, pid)

    @staticmethod
    def raise_forked(forks: Any) -> None:
        """An AnalysisError if the model's code forked the process (:meth:`enter`)."""
        if forks is None or not forks[:1].strip(b"\0"):
            return
        from ampgraph.errors import AnalysisError

        where = bytes(forks[:]).rstrip(b"\0").decode(errors="replace")
        raise AnalysisError(
            f"the model's code forked the process that analyses it (os.fork at {where}): the "
            "copy would run ampgraph's analysis a second time; a forward must not fork"
        )

    @staticmethod
    def end(process: Any, *, finished: bool) -> None:
        """Kill the group ``process`` leads, the process and everything it started: at once
        when it has sent all it had to (its teardown is no part of the work), else after
        SIGTERM and :data:`GRACE_S`."""
        import signal

        def kill(signum: int) -> None:
            with contextlib.suppress(OSError):  # nothing is left in the group
                os.killpg(process.pid, signum)

        if not finished:
            kill(signal.SIGTERM)
            process.join(GRACE_S)
        # Also after the leader ended: a process it started may ignore SIGTERM.
        kill(signal.SIGKILL)
        process.join()

    @staticmethod
    @contextlib.contextmanager
    def signals_stop() -> Iterator[None]:
        """SIGTERM and SIGHUP to this process (``kill``, a closed terminal) end it by
        ``SystemExit(128 + signal)``, so that :meth:`end` runs as it unwinds; where the
        process has a handler of its own, or this is not the main thread, nothing changes.
        Nor where it was started with the signal ignored (``nohup``, which Unix keeps across
        ``exec``): a hangup is then meant to end neither this process nor its analysis
        (:meth:`enter` keeps it ignored there too), and both run on together."""
        import signal
        import threading

        def stop(signum: int, frame: Any) -> None:
            raise SystemExit(128 + signum)

        installed = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(signum) == signal.SIG_DFL:
                    installed[signum] = signal.signal(signum, stop)
        try:
            yield
        finally:
            for signum, previous in installed.items():
                signal.signal(signum, previous)


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
