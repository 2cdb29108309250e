"""Analyse a model spec in settings: the one entry point of the CLI, notebooks and the docs.

:func:`analyze_spec` is what ``ampgraph table``, ``check`` and ``render`` run: reports already in
the cache (:mod:`ampgraph.pipeline.cache`) are read before torch is imported; the model is built and traced
once (:func:`prepare`) for the rest, which are analysed in forked worker processes
(:func:`ampgraph.pipeline.stages.analyze_many`) and cached. Torch-free itself, so a warm run never
imports torch; nor does a cold command, whose analysis runs in a process group of its own that
the command kills at ``--timeout`` (``process``), while ``render`` loads the renderer.

>>> reports = analyze_spec("llama-tiny", ["amp-fp32"], check=False)
>>> [(r.model, r.setting["name"]) for r in reports]
[('llama-tiny', 'amp-fp32')]
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ampgraph.model.specs import spec_tracer
from ampgraph.pipeline.request import AnalysisRequest
from ampgraph.report.records import Report
from ampgraph.settings import Setting

if TYPE_CHECKING:
    from ampgraph.model.build import ModelInputs

#: Where progress notes go (the CLI: stderr, when a person watches it). None: nowhere.
Progress = Callable[[str], None] | None


def _progress_note(progress: Progress, message: str) -> None:
    if progress is not None:
        progress(message)


#: The collector's thresholds (:func:`gc.set_threshold`) after :func:`frozen_imports`.
ANALYSIS_GC_THRESHOLDS = (10_000, 20, 20)


@contextlib.contextmanager
def frozen_imports() -> Iterator[None]:
    """Import torch and build a model without the cyclic garbage collector, then freeze the heap.

    Importing torch and transformers makes some 400,000 objects that live as long as the process.
    The collector scans all of them at each full collection as the heap grows: six times during
    those imports, 0.7 s of a 6 s cold ``ampgraph render`` on the 2-core machine, to free
    nothing. Collection is paused while the block runs; at its end :func:`gc.freeze` moves
    everything alive into the permanent generation, which later collections skip (and which
    the forked workers then share with their parent instead of copying the pages a collection
    would write to, as the :mod:`gc` docs advise before a fork), and the collector's thresholds
    become :data:`ANALYSIS_GC_THRESHOLDS` for the analysis that follows. Only in a process where
    torch is not imported yet, the one that pays for the imports; elsewhere (a notebook that has
    torch already) nothing changes.

    >>> with frozen_imports():
    ...     import json
    """
    if "torch" in sys.modules:
        yield
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        # The analysis makes fake tensors and graph nodes by the hundred thousand, nearly all
        # freed by reference counting: at the default thresholds (700, 10, 10) collection took
        # 0.9 s of the Llama-3-70B shape's capture and annotation, at these 0.3 s.
        gc.set_threshold(*ANALYSIS_GC_THRESHOLDS)
        if enabled:
            gc.enable()


def prepare(
    spec: str, *, seq_len: int = 8, force: bool = False, progress: Progress = None,
    tracer: str | None = None,
) -> ModelInputs:  # fmt: skip
    """Build the model ``spec`` names on meta and trace it with ``tracer`` (default: the spec's
    own), once.

    What every command that needs the model itself runs (the analysis, and ``verify``); imports
    and the build run under :func:`frozen_imports`.

    >>> type(prepare("llama-tiny", seq_len=4).module).__name__
    'LlamaForCausalLM'
    """
    _progress_note(progress, f"building {spec} on the meta device...")
    with frozen_imports():
        from ampgraph.model.build import load_model
        from ampgraph.pipeline.stages import trace

        model = load_model(spec, seq_len=seq_len, force=force)
        return trace(model, tracer or spec_tracer(spec))


def report_requests(
    spec: str,
    settings: Sequence[Setting],
    *,
    seq_len: int,
    check: bool,
    options: dict[str, Any] | None = None,
) -> list[dict[str, Any] | None]:
    """What ``spec``'s report in each setting is cached under and checked against
    (:func:`ampgraph.pipeline.cache.entry_requests` of the
    :class:`~ampgraph.pipeline.request.AnalysisRequest` these arguments make); None where it is
    never cached (a ``package.module:factory`` spec runs arbitrary code).

    >>> [r["model"]["name"] for r in report_requests("opt", [Setting.parse("fp32")], seq_len=8,
    ...                                              check=True)]
    ['opt-125m']
    >>> report_requests("torch.nn:Linear", [Setting.parse("fp32")], seq_len=8, check=True)
    [None]
    """
    from ampgraph.pipeline import cache

    request = AnalysisRequest.of(spec, settings, options, seq_len=seq_len, check=check)
    return cache.entry_requests(request)


def report_keys(
    spec: str,
    settings: Sequence[Setting],
    *,
    seq_len: int,
    check: bool,
    options: dict[str, Any] | None = None,
) -> list[str | None]:
    """The cache key of each of :func:`report_requests`, or None where it is never cached.

    >>> [len(k) for k in report_keys("opt", [Setting.parse("fp32")], seq_len=8, check=True)]
    [64]
    >>> report_keys("torch.nn:Linear", [Setting.parse("fp32")], seq_len=8, check=True)
    [None]
    """
    from ampgraph.pipeline import cache

    requests = report_requests(spec, settings, seq_len=seq_len, check=check, options=options)
    return [cache.key_of(r) if r is not None else None for r in requests]


def cached_report(request: dict[str, Any] | None) -> Report | None:
    """The cached report for ``request`` (:func:`report_requests`), or None: also for an entry
    stored for another request, and one that is damaged, foreign, of another schema, or that
    :meth:`Report.from_dict <ampgraph.report.records.Report.from_dict>` refuses (the fresh report
    replaces it)."""
    from ampgraph.pipeline import cache

    data = cache.load(request) if request is not None else None
    if data is None:
        return None
    try:
        return Report.from_dict(data)
    except Exception:  # noqa: BLE001 - refused (AmpgraphError, ValueError, ...): a miss, recompute
        return None


def analyze_spec(
    spec: str,
    settings: Sequence[Setting | str] | None = None,
    *,
    seq_len: int = 8,
    check: bool = True,
    use_cache: bool = True,
    workers: int | None = None,
    force: bool = False,
    progress: Progress = None,
    options: dict[str, Any] | None = None,
    meanwhile: Callable[[], None] | None = None,
    timeout: float | None = None,
    process: bool | None = None,
) -> list[Report]:
    """The analysis of the model ``spec`` names in each setting, in order.

    ``spec`` is what :func:`ampgraph.load_model` takes (a :class:`~ampgraph.model.specs.ModelSpec`
    also says which tracer to use); ``settings`` are :class:`~ampgraph.settings.Setting` objects
    or names (default: the seed notebook's four). Reports are read from the cache where they are
    (``use_cache``); the rest are computed after building the model once, in up to ``workers``
    forked processes (default: one per core), and cached. ``force`` analyses a config beyond any
    published model; ``progress`` receives notes on the way. ``options`` go to
    :func:`ampgraph.analyze` (``pass_``, ``loss``, ``backward_autocast``, ``tables``, ``sources``)
    and into the cache key: with the rest, they make the
    :class:`~ampgraph.pipeline.request.AnalysisRequest` that :func:`analyze_request` runs.

    ``meanwhile`` is work of the caller's own that does not need the reports (the CLI's
    ``render`` imports the renderer in it). Given it, for the forward pass, in a process that
    has not imported torch, on a machine with more than one core, the analysis runs in a forked
    process of its own (:func:`analysis_beside`) and ``meanwhile`` runs here at the same time,
    on the core the imports of torch and the model's code leave idle; elsewhere it runs first.
    Either way it has run when this returns, and what it raises is raised here (the analysis is
    then stopped).
    Without it the analysis runs in this process, which then has torch and the model's code for
    the next call (``ampgraph diff`` of two models, a documentation build's directives).

    The model's own code runs confined (:mod:`ampgraph.model.usercode`): what it prints goes to
    standard error, where the caller's output is not; its ``os._exit`` and ``sys.exit`` are
    errors. ``process`` (default: when a ``timeout`` is given; the command line always) runs
    the analysis in a forked process group of its own (:func:`ampgraph.pipeline.workers.run_in_fork`
    with ``group``), which this process kills whatever the model's code does: then an analysis
    that has not finished after ``timeout`` seconds (None or 0: no bound) is stopped with an
    :class:`~ampgraph.errors.AnalysisError` (a forward that never returns, or that catches every
    exception and signal), and the model's threads, forks and ``SystemExit`` cannot reach the
    caller's output or exit status. A bound needs that process: code that runs in the caller's
    own process cannot be stopped from there. A process that has imported torch already (a test
    runner, a notebook calling the command line) keeps the analysis in itself, with a best-effort
    deadline, as ``verify`` does: a fork of a process whose OpenMP or autograd threads have run
    cannot run torch's kernels again (the child hangs, or autograd refuses "fork-based
    multiprocessing"). The command line itself never imports torch, so it always isolates.
    """
    import ampgraph.arguments as arguments

    request = AnalysisRequest.of(
        spec, settings, options, seq_len=seq_len, check=check, force=force, timeout=timeout
    )
    workers = arguments.workers(workers)
    return analyze_request(
        request, use_cache=use_cache, workers=workers, progress=progress, meanwhile=meanwhile,
        process=process,
    )  # fmt: skip


def analyze_request(
    request: AnalysisRequest,
    *,
    use_cache: bool = True,
    workers: int | None = None,
    progress: Progress = None,
    meanwhile: Callable[[], None] | None = None,
    process: bool | None = None,
) -> list[Report]:
    """The reports ``request`` asks for (its ``model`` a spec), in the order of its settings:
    :func:`analyze_spec` once its arguments are one request, which the command line builds
    itself. The other arguments say how it runs, not what it computes: see
    :func:`analyze_spec`.

    >>> reports = analyze_request(AnalysisRequest("llama-tiny", ("amp-fp32",), check=False))
    >>> [(r.model, r.setting["name"]) for r in reports]
    [('llama-tiny', 'amp-fp32')]
    """
    from ampgraph.pipeline import cache

    if request.model is None:
        raise TypeError("analyze_request() needs a request that names a model spec")
    settings = request.settings
    requests = cache.entry_requests(request) if use_cache else [None for _ in settings]
    reports: list[Report | None] = [cached_report(r) for r in requests]
    missing = [i for i, r in enumerate(reports) if r is None]
    if missing:
        work = _Missing(request, requests, reports, missing, workers, progress)
        _run_missing(work, meanwhile, process)
    elif meanwhile is not None:
        meanwhile()
    return [r for r in reports if r is not None]


class _Missing:
    """The reports :func:`analyze_request` found in no cache: computed, stored, noted."""

    def __init__(
        self, request: AnalysisRequest, requests: list[dict[str, Any] | None],
        reports: list[Report | None], missing: list[int], workers: int | None,
        progress: Progress,
    ) -> None:  # fmt: skip
        self.request, self.requests, self.reports = request, requests, reports
        self.missing, self.workers, self.progress = missing, workers, progress
        self.finished: list[str] = []

    def done(self, j: int, report: Report) -> None:
        """The ``j``-th missing report is here: keep it, cache it, say so."""
        from ampgraph.pipeline import cache

        index = self.missing[j]
        self.reports[index] = report
        entry = self.requests[index]
        if entry is not None:
            cache.store(entry, report.to_dict())
        self.finished.append(self.request.settings[index].name)
        _progress_note(self.progress, f"analysing {_settings(len(self.missing))}: "
                       f"{len(self.finished)} done ({', '.join(self.finished)})")  # fmt: skip

    def compute(self, on_done: Callable[[int, Report], None]) -> None:
        """Build and trace the model, then analyse the missing settings, each to ``on_done``."""
        from ampgraph.model.usercode import model_code

        request = self.request
        # Import, build, trace and check: where the model's code runs, and the workers fork.
        with model_code():
            model = prepare(request.model or "", seq_len=request.seq_len, force=request.force,
                            progress=self.progress, tracer=request.traced_by)  # fmt: skip
            from ampgraph.pipeline.stages import analyze_in_workers

            _progress_note(self.progress, f"analysing {_settings(len(self.missing))} (trace, "
                           + ("annotate, check)" if request.check else "annotate)"))  # fmt: skip
            share = request.with_settings([request.settings[i] for i in self.missing])
            analyze_in_workers(model, share, workers=self.workers, on_done=on_done)


def _run_missing(
    work: _Missing, meanwhile: Callable[[], None] | None, process: bool | None
) -> None:
    """``work`` in a forked process group of its own where it is to be isolated or can run
    beside ``meanwhile`` (:func:`analysis_beside`); else here, under the alarm."""
    from ampgraph.model.usercode import deadline, overdue_message

    timeout = work.request.timeout
    isolate = bool(timeout) if process is None else process
    if (isolate and _can_fork() and "torch" not in sys.modules) or (
        meanwhile is not None and analysis_beside(work.workers, pass_=work.request.pass_)
    ):
        from ampgraph.pipeline.workers import run_in_fork

        # Bounded here, where the command waits: the process group is killed at the deadline.
        run_in_fork(
            lambda send: work.compute(lambda j, report: send((j, report))),
            lambda item: work.done(*item), len(work.missing), meanwhile,
            name="analysis", timeout=timeout,
            overdue=overdue_message(timeout) if timeout else "", group=True,
        )  # fmt: skip
        return
    if meanwhile is not None:
        meanwhile()
    with deadline(timeout):
        work.compute(work.done)


def _can_fork() -> bool:
    import multiprocessing as mp

    # A pool's (daemonic) worker may not have children.
    return "fork" in mp.get_all_start_methods() and not mp.current_process().daemon


def _settings(count: int) -> str:
    return f"{count} setting{'s' if count != 1 else ''}"


def analysis_beside(workers: int | None = None, *, pass_: str | None = None) -> bool:
    """Whether :func:`analyze_spec`, given work to do ``meanwhile``, runs the analysis of the
    pass ``pass_`` (default the forward) in a forked process beside the caller.

    Where this process has not imported torch (the CLI's: a notebook has it already, and keeps
    its own process), the machine has a second core for the caller's work meanwhile, ``workers``
    is not 1 (``-j 1`` keeps everything in one process, for a debugger) and processes can be
    forked. The caller then never imports torch: it receives the reports, which are plain data.
    The analysis process forks the workers that analyse the settings (:func:`ampgraph.pipeline.stages.
    analyze_many`), as the caller did before.

    Not for a training step: its reports are four times bigger, and their extra hop from the
    analysis process cost more than the overlap saves (``render --pass train`` of OPT-125M read
    0.4 to 1.6 s slower beside in three interleaved A/B sets).
    """
    import multiprocessing as mp

    from ampgraph.pipeline.workers import default_workers

    return (
        pass_ in (None, "forward")
        and "torch" not in sys.modules
        and workers != 1
        and default_workers() > 1
        and "fork" in mp.get_all_start_methods()
        and not mp.current_process().daemon  # a pool's worker may not have children
    )


__all__ = [
    "analysis_beside",
    "analyze_request",
    "analyze_spec",
    "cached_report",
    "frozen_imports",
    "prepare",
    "report_keys",
    "report_requests",
]
