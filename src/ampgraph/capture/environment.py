"""What an analysis changes in torch, applied for that analysis only: one context manager.

ampgraph is a library beside the user's own torch code (a notebook, a Lightning process, a docs
build), so importing it changes nothing in torch, and an analysis leaves torch as it found it.
What an analysis needs changed in torch is entered here and restored here, on every exit path
(a return, an error, a timeout's exception, ``KeyboardInterrupt``):

* **meta kernels** stricter than the real kernels, or typing otherwise
  (``capture/meta_kernels.py``): registered at the dispatcher's Meta key through a library whose
  lifetime is the environment (:class:`~ampgraph.capture.scoped_library.ScopedLibrary`: on exit
  the dispatcher's stack of registrations pops ours, and the map of Python kernels that fake
  tensors call through, which ``Library._destroy()`` leaves naming ampgraph's, names torch's
  again), and in ``op.py_kernels`` and ``torch._decomp.meta_table``, whose previous entries are
  put back;
* **driverless kernels** for CUDA ops that have no meta kernel (``capture/driverless.py``);
* torch's warning ``propagate_real_tensors evaluate_expr(...)``, logged for each guard decided
  on a data-dependent size the analysis gave its real value: a filter on that logger, removed;
* the tests torch guesses on a data-dependent size (``guard_or_false``, ``guard_or_true``),
  decided on the size's real value where the analysis knows it and the guess is wrong for it
  (``capture/guesses.py``): ``symbolic_shapes._guard_or`` gets its previous value back;
* on torch 2.9 without a GPU driver, **the CUDA device guard**, the SDPA stand-in and
  ``torch._C._select_conv_backend`` (``capture/driverless_29.py``): the registry slot and the
  attribute get their previous values back.

Not entered nor restored here: the two ops of ampgraph's own namespace (``ampgraph::raises``,
``ampgraph::past_raise``: ``capture/raises.py``, ``capture/reads.py``), registered once, inert (no
torch kernel changes, nothing but ampgraph's graphs calls them), and kept because the graphs that
name them outlive an analysis.

Fake tensors cache outputs by inputs' metadata, so the cache is cleared on entry and on exit: no
output typed by ampgraph's kernels outlives the environment.

Changes that belong to one step of an analysis, not to all of it, stay scoped where that step is
(each a context manager restoring on exit): ``torch.compiler``'s flags while the model's own code
runs in a capture (``is_compiling()`` false as in an eager run, ``is_exporting()`` as the engine
or a real run has it: ``capture/raises.py``; ``verify/training.py``), the real values of small
integer buffers and inputs beside their fake tensors, and transformers' "is this traced?" answered
as a real run where those values are known (``capture/known_values.py``), the autocast queries
logged while tracing (``capture/reads.py``), the virtual GPU's answers (``torchutil.simulated_cuda_amp``), a
what-if's overridden autocast kernels (``review/whatif.py``), cuDNN RNN stand-ins
(``driverless.cudnn_rnn_stand_ins``).

What the analysis itself runs under (:class:`AnalysisEnvironment`, frozen from its request:
stack traces, the release of the policy tables, and what its real run is allowed and chosen to
do, :class:`RealRun`) is handed down in context variables, read by :func:`current` and
:func:`ampgraph.policy.lookup`, never module globals a stage rebinds: an analysis in another
thread reads its own.

**Module state that stays, on purpose** (every other module-level value of the package is a
constant, a table of data, or a cache of a fact of the process, ``functools.cache``: torch's
build, the CPU, a kernel's registration). Each is process-wide because what it tracks is:

* ``_DEPTH``, ``_UNDO`` and ``_LOCK`` here: torch's dispatcher is one per process, so the count of
  analyses inside it and the way back out are too;
* ``ampgraph.model.usercode``'s count of open blocks that refuse ``os._exit`` (``os._exit`` is one
  per process, replaced while any block is open, in any thread);
* ``ampgraph.capture.raises._RAISES`` and ``ampgraph.capture.reads._PAST_RAISE``: the two inert
  ops of ampgraph's namespace, registered once (below);
* ``ampgraph.capture.driverless_29._WHY``: why torch 2.9's device guard cannot be installed, asked
  once and said once, since the answer is the library's, not the analysis's; and its
  ``STAND_INS``, filled and emptied with the torch changes above (entered here, process-wide);
* ``ampgraph.pipeline.stages._IN_WORKER``: set only in a forked worker, the model its fork
  handed it; never in the process that runs the analysis;
* the command line's stage line (``ampgraph.cli.console``): the terminal's, not an analysis's.

What a what-if or another release's tables let the annotation learn about composite ops is kept
with those tables (:func:`ampgraph.policy.tables_memo`), so it goes when they do: memory does not
grow with repeated what-ifs (``bench/whatif_memory.py``).

**Re-entrant**: a nested analysis (a what-if inside an analysis, an API call inside the CLI's)
enters nothing more; the outermost exit restores.

**Threads**: torch's dispatcher and these tables are process-wide, so while any thread is inside
an analysis every thread of the process sees ampgraph's meta kernels (a ``torch.compile`` in
another thread at that moment types those few ops as the real kernels do, which is what the
replacements are for, but it is not torch's own meta kernel). Entering and leaving are serialised
by a lock and counted across threads, so the kernels are in place while at least one analysis
runs in any thread and gone once the last one ends. Forked worker processes inherit the state of
the parent at the fork and restore their own copy.

>>> import torch
>>> import torch.nn.functional as F
>>> def huber() -> torch.dtype:
...     x = torch.empty(3, dtype=torch.bfloat16, device="meta")
...     return F.huber_loss(x, torch.empty(3, device="meta")).dtype
>>> huber()
torch.float32
>>> with analysis_environment():
...     huber()
torch.bfloat16
>>> huber()
torch.float32
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar


@dataclass(frozen=True)
class RealRun:
    """What the real run of an analysis (``verify``'s, ``ranges``' reference run: real kernels on
    the CPU, or CUDA on a GPU) is allowed and chosen to do in each of its settings: one value
    built from the request, instead of arguments handed from setting to setting.

    ``seed``: the random weights' and inputs' seed where the model has no weights of its own (an
    integer of 64 bits at most). ``force``: allowed past the memory checks (weights beyond the
    device's free memory). ``weights_dir``: a folder of ``*.safetensors`` shards whose weights
    ``ranges`` reads instead of seeded ones. ``stream``: ``ranges`` reads those weights one at a
    time (True), all at once (False), or where they do not fit in memory (None).

    >>> RealRun(seed=3).seed, RealRun().stream
    (3, None)
    """

    seed: int = 0
    force: bool = False
    weights_dir: Path | None = None
    stream: bool | None = None

    def given(self, **overrides: Any) -> RealRun:
        """This real run with each override that is not None (a Python API's keyword arguments:
        None, the default, leaves the environment's choice).

        >>> RealRun(seed=3, force=True).given(seed=None, force=False)
        RealRun(seed=3, force=False, weights_dir=None, stream=None)
        """
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


@dataclass(frozen=True)
class AnalysisEnvironment:
    """What the stages of one analysis run under, beyond the model and the setting: built from
    the request (``AnalysisRequest.environment()``) and handed down to capture and the replays by
    :func:`analysis_environment`, instead of process globals a stage sets for the stages below.

    ``stack_traces``: captures record each node's Python stack (audit's source lines read it;
    symbolising stacks is a sixth of the trace time, so only when asked). ``tables``: the torch
    release whose autocast lists the annotation reads (None: the installed torch's), entered for
    the block (:func:`tables_of`, :func:`ampgraph.policy.tables_in_use`: a context variable, so
    it is this analysis's, not the process's). ``real_run``: what ``verify``'s and ``ranges``'
    real runs may do (:class:`RealRun`), read by them with :func:`current`.

    >>> current()                                              # doctest: +NORMALIZE_WHITESPACE
    AnalysisEnvironment(stack_traces=False, tables=None,
        real_run=RealRun(seed=0, force=False, weights_dir=None, stream=None))
    >>> from ampgraph.policy import release_in_use
    >>> with analysis_environment(AnalysisEnvironment(stack_traces=True, tables="2.11")):
    ...     current().stack_traces, release_in_use()
    (True, '2.11')
    """

    stack_traces: bool = False
    tables: str | None = None
    real_run: RealRun = RealRun()

    def run_given(self, **overrides: Any) -> AnalysisEnvironment:
        """This environment with its real run's choices overridden where given
        (:meth:`RealRun.given`).

        >>> AnalysisEnvironment().run_given(seed=7).real_run.seed
        7
        """
        return replace(self, real_run=self.real_run.given(**overrides))


def tables_of(release: str | None) -> contextlib.AbstractContextManager[None]:
    """Annotate with the policy tables of torch ``release`` while it lasts (``"2.11"``; None or
    the installed torch's release: its own). :class:`~ampgraph.errors.SettingError` for a
    release the history does not reach.

    >>> from ampgraph.policy import lookup
    >>> with tables_of("2.11"):
    ...     lookup("cuda", "aten::rms_norm", "")
    """
    import ampgraph.policy as P
    from ampgraph.errors import SettingError

    if release is None:
        return contextlib.nullcontext()
    try:
        name = P.release_name(release)
    except ValueError as exc:
        raise SettingError(str(exc)) from None
    if name == P.ACTIVE_RELEASE:
        return contextlib.nullcontext()
    return P.tables_in_use(P.tables_for(name), name)


#: The environment of the analysis running in this thread (or asyncio task): a context variable,
#: so analyses in two threads each see their own.
_CURRENT: contextvars.ContextVar[AnalysisEnvironment] = contextvars.ContextVar(
    "ampgraph_analysis_environment", default=AnalysisEnvironment()
)


def current() -> AnalysisEnvironment:
    """The environment of the analysis running here (the default one outside any)."""
    return _CURRENT.get()


_LOCK = threading.RLock()
#: How many analyses are inside the environment now (any thread), and how to undo it.
_DEPTH = [0]
_UNDO: list[Callable[[], None]] = []

F = TypeVar("F", bound=Callable[..., Any])


def _enter() -> list[Callable[[], None]]:
    """Apply every change; the undo steps, in the order they must run."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ampgraph.capture import driverless, driverless_29, guesses, meta_kernels
    from ampgraph.torchutil import dropping_notice

    undo: list[Callable[[], None]] = []
    try:
        # The capture gives each data-dependent size the value a real run has (followed inputs,
        # a replay's sizes from its capture: capture/known_values.py, annotate/replay.py), and
        # torch logs every guard it then decides on such a value as a warning: its internals,
        # not the user's model, on every command's stderr.
        undo.append(dropping_notice(
            "torch.fx.experimental.symbolic_shapes", "propagate_real_tensors evaluate_expr"
        ))  # fmt: skip
        undo.append(meta_kernels.install())
        # The tests torch guesses on a data-dependent size, decided on its real value where the
        # capture knows it (a wrong guess's assertion lost LightGlue in draft export).
        undo.append(guesses.install())
        undo.append(driverless.install())
        undo.append(driverless_29.install())
    except BaseException:
        for step in reversed(undo):
            step()
        raise
    FakeTensorMode.cache_clear()
    undo.reverse()
    undo.append(FakeTensorMode.cache_clear)
    return undo


@contextlib.contextmanager
def analysis_environment(environment: AnalysisEnvironment | None = None) -> Iterator[None]:
    """Inside, torch runs as an analysis needs it; outside, as torch itself is (the module's
    docstring says what changes). Re-entrant, and safe to enter from several threads.

    ``environment`` (None: the one in effect, or the default) is what the stages inside read
    with :func:`current`; the previous one is back on exit."""
    with _LOCK:
        if _DEPTH[0] == 0:
            _UNDO[:] = _enter()
        _DEPTH[0] += 1
    token = _CURRENT.set(environment) if environment is not None else None
    try:
        with tables_of(environment.tables if environment is not None else None):
            yield
    finally:
        if token is not None:
            _CURRENT.reset(token)
        with _LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                steps, _UNDO[:] = list(_UNDO), []
                for step in steps:
                    step()


def active() -> bool:
    """Whether an analysis is inside the environment now (in any thread).

    >>> active()
    False
    """
    return _DEPTH[0] > 0


def in_analysis_environment(function: F) -> F:
    """``function`` run inside :func:`analysis_environment` (for the library's entry points)."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with analysis_environment():
            return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


__all__ = [
    "AnalysisEnvironment", "RealRun", "active", "analysis_environment", "current",
    "in_analysis_environment", "tables_of",
]
