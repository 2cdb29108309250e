"""The pipeline in one call: capture -> annotate -> (check) -> :class:`~ampgraph.report.records.Report`.

>>> from ampgraph import analyze, load_model, Setting
>>> report = analyze(load_model("llama-tiny"), Setting.parse("amp-fp32"), check=False)
>>> print(report.modules[3].hook_line())
[model.layers.0.self_attn.q_proj] in=torch.float32 -> out=torch.bfloat16
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ampgraph.capture.environment import analysis_environment, in_analysis_environment, tables_of
from ampgraph import policy as P
from ampgraph.annotate import cpu_backend
from ampgraph.annotate.annotator import annotate
from ampgraph.annotate.check import dispatcher_unavailable, hold_to_the_raise
from ampgraph.capture.trace import (
    DATA_PATH_METHODS,
    Capture,
    capture,
)
from ampgraph.errors import SettingError
from ampgraph.model.build import ModelInputs
from ampgraph.pipeline.call_check import check as run_check
from ampgraph.pipeline.calls import module_calls
from ampgraph.pipeline.request import AnalysisRequest
from ampgraph.pipeline.sharing import shared_capture
from ampgraph.pipeline.workers import default_workers, die_with_parent, run_in_fork
from ampgraph.policy import release_in_use
from ampgraph.report.records import NodeRecord, Report
from ampgraph.settings import Setting
from ampgraph.torchutil import fake_device_built, grad_mode_name
from ampgraph.version import __version__


def versions() -> dict[str, str]:
    """Versions that decide the analysis: ampgraph, torch, transformers, the policy tables."""
    import torch

    out = {
        "ampgraph": __version__,
        # A str, not torch's TorchVersion: a report is plain data, which a process without
        # torch unpickles without importing torch (1.5 s) for it.
        "torch": str(torch.__version__),
        "policy_tables": release_in_use(),
    }
    transformers = sys.modules.get("transformers")
    if transformers is None:
        try:
            import transformers
        except ImportError:
            transformers = None
    out["transformers"] = str(getattr(transformers, "__version__", "not installed"))
    return out


def _other_tables() -> str | None:
    """Why the check cannot judge the annotation: it read another torch release's tables."""
    if release_in_use() == P.ACTIVE_RELEASE:
        return None
    return (
        f"annotated with the policy tables of torch {release_in_use()}, a prediction for that "
        f"release that this torch {torch.__version__}'s dispatcher cannot check"
    )


def _cpu_kernels(records: list[NodeRecord]) -> str | None:
    """What the CPU prediction assumed of this machine, where a 16-bit convolution depends on it
    (:func:`ampgraph.annotate.cpu_backend.note_for`)."""
    return cpu_backend.note_for(
        (r.op, [i.get("dtype") for i in r.inputs] + [c.to_dtype for c in r.casts])
        for r in records
    )


def stand_in_note(setting: Setting) -> str | None:
    """Why ``setting`` is predicted rather than checked, where this torch cannot trace fake
    tensors on its device (XPU or MPS in a build without them,
    :func:`~ampgraph.torchutil.fake_device_built`); None where it can.

    >>> stand_in_note(Setting.parse("amp-fp32", device_type="cpu")) is None
    True
    """
    device = setting.device_type
    if fake_device_built(device):
        return None
    return (
        f"a prediction for {device}: this torch {torch.__version__} is built without "
        f"{device}, so the graph was traced on fake CUDA tensors and annotated with {device}'s "
        f"autocast lists, not checked against {device}'s kernels"
    )


@contextlib.contextmanager
def traced_setting(setting: Setting) -> Iterator[Setting]:
    """The setting to trace for ``setting`` while it lasts: ``setting`` itself, or, for a
    device this torch cannot trace fake tensors on (:func:`stand_in_note`), the same setting on
    CUDA annotated with ``setting``'s device's autocast lists.

    Autocast's kernels do on XPU and MPS what they do on CUDA, with each device's own lists
    (:mod:`ampgraph.policy`), so the annotation is that device's; what it cannot be is checked
    against its kernels here, and the report says so (``capture.stand_in``) and names
    ``setting``: the caller hands ``setting`` to :func:`report_of`, which says both.

    >>> with traced_setting(Setting.parse("amp-fp32", device_type="cpu")) as traced:
    ...     traced.device_type
    'cpu'
    """
    device = setting.device_type
    if stand_in_note(setting) is None:
        yield setting
        return
    tables = P.current_tables()
    tables["cuda"] = tables.get(device, {})
    with P.tables_in_use(tables, release_in_use()):
        yield replace(setting, device_type="cuda")


#: Graphs at least this big run the dispatcher check in a forked process beside the annotation.
PARALLEL_CHECK_NODES = 400


def _oracle_beside(cap: Capture, work: Any) -> tuple[Any, dict[str, dict[str, Any]]]:
    """Run ``work()`` here and the dispatcher oracle in a forked child at the same time."""
    from ampgraph.annotate.check import dispatcher_results

    oracle: list[dict[str, dict[str, Any]]] = []
    result = run_in_fork(
        lambda send: send(dispatcher_results(cap)), oracle.append, 1, work,
        name="dispatcher check",
    )  # fmt: skip
    return result, oracle[0]


@in_analysis_environment
def analyze_capture(
    cap: Capture,
    *,
    check: bool = True,
    pass_: str = "forward",
    loss: str | int | None = None,
    backward_autocast: bool = False,
    records: list[NodeRecord] | None = None,
) -> Report:
    """Annotate (and by default check) an existing capture.

    For large graphs on a machine with more than one core, the dispatcher check runs in a forked
    process while the annotation runs here: the two are independent replays of the same graph.
    ``pass_`` ``backward`` or ``train`` adds the training step (:mod:`ampgraph.train.backward`).
    ``records`` is the capture's annotation where it was made already (:func:`shared_capture`).
    The arguments are those of an :class:`~ampgraph.pipeline.request.AnalysisRequest`
    (:func:`report_of`).
    """
    request = AnalysisRequest(
        settings=(cap.setting,), check=check, pass_=pass_, loss=loss,
        backward_autocast=backward_autocast,
    )  # fmt: skip
    return report_of(cap, request, records=records)


def _unchecked(cap: Capture, request: AnalysisRequest, stand_in: str | None) -> str | None:
    """Why the check the request asks for cannot run on ``cap`` (None: it can, or none is
    asked for): a stand-in device, a CPU-only torch and --device cuda, another release's
    tables."""
    if not request.check:
        return None
    return stand_in or dispatcher_unavailable(cap.setting.device_type) or _other_tables()


def _annotated(
    cap: Capture, check: bool, records: list[NodeRecord] | None
) -> tuple[list[NodeRecord], Any]:
    """The capture's annotation (``records`` where it was made already) and, with ``check``,
    its check: in a forked process beside the annotation for a large graph where one can be
    forked."""
    import multiprocessing as mp

    parallel = (
        check
        and len(cap.graph_module.graph.nodes) >= PARALLEL_CHECK_NODES
        and default_workers() > 1
        and "fork" in mp.get_all_start_methods()
        and not mp.current_process().daemon  # pool workers may not have children
    )
    if records is not None:
        return records, run_check(cap, records) if check else None
    if parallel:
        records, oracle = _oracle_beside(cap, lambda: annotate(cap))
        return records, run_check(cap, records, oracle)
    records = annotate(cap)
    return records, run_check(cap, records) if check else None


def _capture_section(cap: Capture, unavailable: str | None) -> dict[str, Any]:
    """The report's ``capture`` section: how the graph was traced, and what that means."""
    return {
        "method": cap.method,
        # The grad mode the forward was traced in, which model code may branch on.
        "grad_mode": grad_mode_name(cap.training),
        "trace_time_dtype_nodes": cap.trace_time_dtype_nodes,
        "dtype_branches": cap.dtype_branches,
        # Branches decided on data values while tracing (draft-export): the path analysed.
        **(
            {"data_dependent": cap.data_dependent, "unbacked_values": cap.unbacked_values}
            if cap.method in DATA_PATH_METHODS
            else {}
        ),
        # Why the check asked for did not run (a CPU-only torch and --device cuda).
        **({"check_unavailable": unavailable} if unavailable else {}),
        # The setting whose trace this is, proven to be the one this setting would give.
        **({"graph_of": cap.graph_of} if cap.graph_of else {}),
        # Traced on a real run's path, where export's raised (capture.raises.as_a_real_run).
        **({"real_run": cap.real_run} if cap.real_run else {}),
    }


def report_of(
    cap: Capture,
    request: AnalysisRequest,
    *,
    records: list[NodeRecord] | None = None,
    setting: Setting | None = None,
) -> Report:
    """The report of ``cap`` as ``request`` asks for it (:func:`analyze_capture`).

    ``setting`` is the setting the report is of, where the graph was traced in another: the
    CUDA stand-in of a device this torch cannot trace on (:func:`traced_setting`).
    """
    asked = setting or cap.setting
    stand_in = stand_in_note(asked) if asked.device_type != cap.setting.device_type else None
    unavailable = _unchecked(cap, request, stand_in)
    check = request.check and unavailable is None
    records, summary = _annotated(cap, check, records)
    report = Report(
        model=cap.model_name,
        setting=asked.to_dict(),
        versions=versions(),
        capture=_capture_section(cap, unavailable),
        nodes=records,
        modules=module_calls(records, cap.modules, cap.module_io, cap.call_order),
        check=summary,
        pass_=request.pass_,
    )
    if stand_in:
        report.capture["stand_in"] = stand_in
    if cap.setting.device_type == "cpu" and (kernels := _cpu_kernels(records)):
        report.capture["cpu_kernels"] = kernels  # the backend this CPU's convolutions take
    if cap.raised_in_setting is not None:
        report.capture["raised_in_setting"] = cap.raised_in_setting
        hold_to_the_raise(report)
    if request.training:
        _add_training_step(report, cap, request, check)
    return report


def _add_training_step(
    report: Report, cap: Capture, request: AnalysisRequest, check: bool
) -> None:
    """``report.backward``: the training step's loss and backward (:mod:`ampgraph.train`), and
    with ``check`` its check against the dispatcher."""
    from ampgraph.train.backward import backward_section, trace_joint

    trace = trace_joint(cap, loss=request.loss, backward_autocast=request.backward_autocast)
    report.backward = backward_section(trace)
    if check and not report.backward.skipped:
        from ampgraph.train.joint_check import check_backward

        check_backward(trace, report.backward)


def analyze_group(
    model: ModelInputs | nn.Module | str,
    settings: Sequence[Setting | str],
    *,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    check: bool = True,
    tracer: str | None = None,
    tables: str | None = None,
    sources: bool = False,
    pass_: str = "forward",
    loss: str | int | None = None,
    backward_autocast: bool = False,
) -> list[Report]:
    """Analyse one model in several settings, capturing only where a graph cannot be shared.

    The first setting is captured; each later one reuses the first graph captured in its device
    type and parameter dtype wherever :func:`shared_capture` proves it is the graph its own
    capture would give, and is captured afresh otherwise. A shared graph's report says whose it
    is (``capture.graph_of``); a refused one why (``capture.not_shared``). Same arguments as
    :func:`analyze`. A training step (``pass_`` other than ``forward``) shares its training-mode
    graph alike: the joint graph is differentiated from the forward graph and the setting alone,
    so a graph proven to be the one a fresh capture would give yields the fresh capture's step.

    >>> import torch
    >>> from ampgraph import Setting
    >>> reports = analyze_group(torch.nn.Linear(4, 4), ["fp32", "amp-fp32"],
    ...                         args=(torch.randn(2, 4),), check=False)
    >>> [(r.setting["name"], r.capture.get("graph_of"), r.node("linear").out_dtype) for r in reports]
    [('fp32', None, 'float32'), ('amp-fp32', 'fp32', 'bfloat16')]
    """
    import ampgraph.arguments as arguments

    request = AnalysisRequest(
        model if isinstance(model, str) else None, arguments.settings(settings), check=check,
        tracer=tracer, tables=tables, sources=sources, pass_=pass_, loss=loss,
        backward_autocast=backward_autocast,
    )  # fmt: skip
    return analyze_model(trace(as_model_inputs(model, args, kwargs), request.traced_by), request)


@in_analysis_environment
def analyze_model(model: ModelInputs, request: AnalysisRequest) -> list[Report]:
    """The reports of ``model`` (traced already, :func:`trace`) in each of the request's
    settings, in order: what :func:`analyze_group` does once it has its request."""
    with analysis_environment(request.environment()):  # its tables, its stack traces
        return _analyze_sharing(model, request)


def _analyze_sharing(model: ModelInputs, request: AnalysisRequest) -> list[Report]:
    bases: list[Capture] = []
    reports = []
    for asked in request.settings:
        with traced_setting(asked) as setting:
            refused = None
            for base in bases:
                shared = shared_capture(base, setting)
                if isinstance(shared, str):
                    if base.setting.graph_key == setting.graph_key:
                        refused = f"{base.setting.name}'s graph: {shared}"
                    continue
                cap, records = shared
                reports.append(report_of(cap, request, records=records, setting=asked))
                break
            else:
                cap = capture(model, setting, training=request.training)
                report = report_of(cap, request, setting=asked)
                if refused:
                    report.capture["not_shared"] = refused
                reports.append(report)
                bases.append(cap)
    return reports


def analyze(
    model: ModelInputs | nn.Module | str,
    setting: Setting | str = "amp-fp32",
    *,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    check: bool = True,
    tracer: str | None = None,
    pass_: str = "forward",
    loss: str | int | None = None,
    backward_autocast: bool = False,
    tables: str | None = None,
    sources: bool = False,
) -> Report:
    """Analyse one model in one setting.

    ``model`` is a model spec (``"llama-tiny"``, see :func:`ampgraph.load_model`), what
    :func:`ampgraph.load_model` returns, or any ``nn.Module`` together with ``args`` (a tuple, or
    one tensor) and ``kwargs`` for one forward call (real, meta or fake tensors: only shapes and
    dtypes are used, and the module's own tensors are left untouched). ``setting`` is a
    :class:`~ampgraph.settings.Setting` or its name. ``tracer`` turns the model into a
    graph (:mod:`ampgraph.capture.tracers`; default: a spec's own, else ``make-fx``).

    ``pass_`` is ``forward`` (the default), ``backward`` or ``train``: the latter two trace the
    model in training mode and add ``report.backward``, the loss ``output.float().sum()`` of the
    output ``loss`` names (a key or index; default the first floating output) and its backward,
    run outside the autocast context as PyTorch's AMP recipe does, or inside it with
    ``backward_autocast=True`` (see :mod:`ampgraph.train.backward`).

    ``tables`` annotates with the policy tables of another torch release (``"2.11"``, back to
    :data:`ampgraph.policy.HISTORY_FROM`; :func:`tables_of`): a prediction for that release,
    which the installed dispatcher cannot check, so the report says it is not checked
    (``capture.check_unavailable``). The graph is still traced by the installed torch.

    ``sources`` records where in the model's code each node was made (``NodeRecord.source``,
    file and line; what ``ampgraph audit`` shows): the capture then keeps Python stack traces,
    which makes it slower, so it is off by default.

    >>> import torch
    >>> from ampgraph import analyze
    >>> r = analyze(torch.nn.Linear(4, 4), "amp-fp32", args=(torch.randn(2, 4),))
    >>> [(c.node, c.from_dtype, c.to_dtype) for c in r.node("linear").casts]
    [('input', 'float32', 'bfloat16'), ('p_weight', 'float32', 'bfloat16'), ('p_bias', 'float32', 'bfloat16')]
    """
    request = AnalysisRequest(
        model if isinstance(model, str) else None, (setting,), check=check, tracer=tracer,
        pass_=pass_, loss=loss, backward_autocast=backward_autocast, tables=tables,
        sources=sources,
    )  # fmt: skip
    tables_of(tables)  # a release the history does not reach fails before the model is built
    return analyze_model(trace(as_model_inputs(model, args, kwargs), request.traced_by),
                         request)[0]  # fmt: skip


def as_model_inputs(
    model: ModelInputs | nn.Module | str,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
) -> ModelInputs:
    """What :func:`analyze` accepts as a model, as :class:`~ampgraph.model.build.ModelInputs`."""
    from ampgraph.errors import ArgumentError

    if isinstance(model, str):
        from ampgraph.model.build import load_model

        model = load_model(model)
    if isinstance(model, nn.Module):
        if isinstance(args, torch.Tensor):
            args = (args,)  # one input, not its rows
        if not isinstance(args, (tuple, list)):
            raise ArgumentError(
                f"args must be a tuple of the forward's inputs, not {type(args).__name__}"
            )
        if kwargs is not None and not isinstance(kwargs, dict):
            raise ArgumentError(f"kwargs must be a dict, not {type(kwargs).__name__}")
        model = ModelInputs(type(model).__name__, model, tuple(args), dict(kwargs or {}))
    if not isinstance(model, ModelInputs):
        raise ArgumentError(
            "analyze() takes a model spec such as 'opt-125m', what load_model() returns, or an "
            f"nn.Module with args=(inputs...), not {type(model).__name__}"
        )
    return model


def trace(model: ModelInputs, tracer: str | None = None) -> ModelInputs:
    """The model as ``tracer`` (see :mod:`ampgraph.capture.tracers`) gives it to the capture.

    ``make-fx`` (the default) and ``export`` trace the model itself in each setting, so the
    model is returned as it is, saying which of the two; another tracer traces it once, here, and
    every setting is captured from that graph.
    """
    if tracer is None or tracer == "make-fx":
        return model
    if tracer == "export":
        return replace(model, engine="export")
    from ampgraph.capture.tracers import apply_tracer  # only for a tracer other than export

    return apply_tracer(model, tracer)


#: In a forked worker only (never in the process that runs the analysis): the model it
#: analyses, handed to :func:`_start_worker` by the pool's fork, so nothing large is pickled.
_IN_WORKER: dict[str, ModelInputs] = {}


def _start_worker(parent: int, model: ModelInputs) -> None:
    """A pool worker's start: it dies with ``parent``, and keeps ``model`` for its jobs. The
    pool forks, so ``model`` reaches the child as the parent's memory, not pickled."""
    die_with_parent(parent)
    _IN_WORKER["model"] = model


@in_analysis_environment
def _analyze_in_worker(job: tuple[list[int], AnalysisRequest]) -> list[tuple[int, Report]]:
    import torch

    torch.set_num_threads(1)  # the workers already use every core between them
    indices, request = job
    try:
        reports = analyze_model(_IN_WORKER["model"], request)
    except (SystemExit, KeyboardInterrupt) as exc:  # the model's: it would end the worker and
        from ampgraph.model.usercode import exit_error  # lose the task, which the pool awaits

        raise exit_error(exc) from None
    # Reports travel pickled, as they are: their JSON form would be made here and read back
    # there, a fifth of a second each way for a training step's report.
    return list(zip(indices, reports, strict=True))


def plan_jobs(settings: Sequence[Setting], workers: int) -> list[list[int]]:
    """Indices of ``settings`` in jobs for ``workers`` processes: one job per group of settings
    that may share a graph (one ``graph_key``: device type and tensor dtypes), split where that leaves a
    worker idle, since a capture on an idle core costs no time.

    >>> names = ["fp32", "half", "amp-half", "amp-fp32"]
    >>> plan_jobs([Setting.parse(n) for n in names], 2)
    [[0, 3], [1, 2]]
    >>> plan_jobs([Setting.parse(n) for n in names], 4)
    [[0], [3], [1], [2]]
    """
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, s in enumerate(settings):
        groups.setdefault(s.graph_key, []).append(i)
    jobs = list(groups.values())
    while len(jobs) < workers and any(len(j) > 1 for j in jobs):
        largest = max(jobs, key=len)
        jobs.insert(jobs.index(largest) + 1, [largest.pop()])
    return jobs


def analyze_many(
    model: ModelInputs,
    settings: Sequence[Setting],
    *,
    check: bool = True,
    workers: int | None = None,
    on_done: Any = None,
    tracer: str | None = None,
    **options: Any,
) -> list[Report]:
    """Analyse one model in several settings, in parallel worker processes where that helps.

    Workers are forked after torch and the model are loaded (and traced once, for a ``tracer``
    other than ``export``), so each setting costs only its own replays, and its own capture where
    it cannot share one (:func:`analyze_group`, :func:`plan_jobs`).
    ``on_done(index, report)`` is called as each setting finishes. ``options`` are those of an
    :class:`~ampgraph.pipeline.request.AnalysisRequest` (``pass_``, ``loss``,
    ``backward_autocast``, ``tables``, ``sources``).

    >>> from ampgraph import load_model, seed_matrix
    >>> reports = analyze_many(load_model("llama-tiny"), seed_matrix()[:2], check=False)
    >>> [(r.setting["name"], r.modules[3].out_dtype) for r in reports]
    [('fp32', 'float32'), ('half', 'bfloat16')]
    """
    request = AnalysisRequest.of(None, settings, options, check=check, tracer=tracer)
    return analyze_in_workers(trace(model, tracer), request, workers=workers, on_done=on_done)


@in_analysis_environment
def analyze_in_workers(
    model: ModelInputs,
    request: AnalysisRequest,
    *,
    workers: int | None = None,
    on_done: Callable[[int, Report], None] | None = None,
) -> list[Report]:
    """:func:`analyze_model` of ``model`` (traced already) in forked worker processes, one
    job per group of settings that may share a graph (:func:`plan_jobs`); ``on_done(index,
    report)`` as each setting finishes."""
    import multiprocessing as mp

    settings = request.settings
    workers = min(len(settings), workers or default_workers())
    results: list[Report | None] = [None] * len(settings)

    def done(index: int, report: Report) -> None:
        results[index] = report
        if on_done is not None:
            on_done(index, report)

    jobs = [(job, request.with_settings([settings[i] for i in job]))
            for job in plan_jobs(settings, workers)]  # fmt: skip
    if workers <= 1 or "fork" not in mp.get_all_start_methods():
        for job, share in jobs:
            for i, report in zip(job, analyze_model(model, share), strict=True):
                done(i, report)
        return [r for r in results if r is not None]
    import os

    with mp.get_context("fork").Pool(
        workers, initializer=_start_worker, initargs=(os.getpid(), model)
    ) as pool:
        for finished in pool.imap_unordered(_analyze_in_worker, jobs):
            for index, report in finished:
                done(index, report)
    return [r for r in results if r is not None]
