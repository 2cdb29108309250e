"""Will it overflow? Value ranges from one real fp32 run, judged against each setting's dtypes.

ampgraph says which dtype every value has in a setting; this says whether the values fit it.
The pieces, one job each:

=========== ==================================================================================
weights     real fp32 weights: the module's own, a folder's safetensors, or seeded
shards      safetensors files read with the one reader's rules, every header entry checked
checkpoint  a folder's shards (its index) checked against the model, then copied into it
stream      weights larger than memory: each made for the node that reads it, then dropped
collect     the captured graph run once for real on the CPU in fp32, each node's outputs reduced
            to their range (largest and smallest non-zero magnitude, zeros, inf, NaN), then dropped
judge       each setting's node records against those ranges: overflow, flush to zero,
            subnormals, casts and constants that do not fit (torch-free)
records     the results as plain data, and the dtypes' limits
formats     the table and summary, JSON and Markdown
=========== ==================================================================================

The reference run uses the graph of the setting ``fp32,inputs=fp32`` (no autocast, fp32
parameters and inputs) on the settings' device type; each setting is captured and annotated as
``ampgraph table`` does, so findings name the nodes and modules the reports and diagrams name.

>>> import torch
>>> from ampgraph.model.build import ModelInputs
>>> lin = torch.nn.Linear(4, 4)
>>> _ = torch.nn.init.constant_(lin.weight, 3e4)
>>> m = ModelInputs("big", lin, (torch.ones(1, 4),))
>>> result = value_ranges(m, ["amp-fp32"], device_type="cpu", amp_dtype="fp16")
>>> print(result.settings[0].first.message)                            # doctest: +ELLIPSIS
linear (linear): max 1.2e+05 > fp16's 65,504; autocast runs linear in fp16 because ...
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ampgraph.capture.environment import analysis_environment, current
from ampgraph.capture.casts import cast_floating
from ampgraph.capture.trace import Capture, capture
from ampgraph.model.build import ModelInputs
from ampgraph.pipeline.stages import analyze_capture
from ampgraph.ranges.collect import graph_constants, run_ranges
from ampgraph.ranges.data import (
    KINDS,
    LIMITS,
    NodeRange,
    RangeFinding,
    RangesError,
    RangesResult,
    SettingRanges,
    ValueRange,
)
from ampgraph.ranges.judge import judge_setting, reference_findings
from ampgraph.ranges.checkpoint import ShardPool
from ampgraph.ranges.stream import should_stream
from ampgraph.ranges.weights import check_memory, real_state
from ampgraph.report.records import NodeRecord
from ampgraph.settings import Setting

if TYPE_CHECKING:
    from ampgraph.ranges.grad_run import GradientRun

Progress = Callable[[str], None] | None


def _note(progress: Progress, text: str) -> None:
    if progress is not None:
        progress(text)


def _reference_values(
    ref_cap: Capture, model: ModelInputs, seed: int, weights_dir: Path | None,
    pool: ShardPool | None,
) -> tuple[list[Any], str]:  # fmt: skip
    """The reference graph's placeholder values on the CPU in fp32, and where the weights came
    from (in words). With ``pool``, the weights are :class:`~ampgraph.ranges.stream.Lazy`
    handles read through it (a model too large for memory)."""
    from ampgraph.verify.tensors import graph_inputs, real_inputs

    if pool is not None and weights_dir is not None:
        from ampgraph.ranges.stream import stream_state

        state, source = stream_state(model.module, seed, weights_dir, pool)
    else:
        state, source = real_state(model.module, seed, weights_dir)
    cpu = torch.device("cpu")
    gen = torch.Generator().manual_seed(seed)
    args, kwargs = cast_floating(real_inputs(model, cpu, gen), "float32")
    return list(graph_inputs(ref_cap, model, args, kwargs, cpu, gen, known=state)), source


def _measure(
    ref_cap: Capture, values: list[Any], modules: dict[str, str | None],
    kinds: dict[str, str], pass_: str, loss: str | int | None, seed: int,
) -> tuple[dict[str, NodeRange], GradientRun | None]:  # fmt: skip
    """The reference run: forward ranges, and with ``pass_`` train the gradients too (dropout's
    masks drawn from ``seed``, so that two runs agree; the caller's random state is kept)."""
    if pass_ != "train":
        return run_ranges(ref_cap, values, modules, kinds), None
    from ampgraph.ranges.grad_run import run_gradients

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        grads = run_gradients(ref_cap, values, modules, kinds, loss)
    for name, slots in grads.nodes.items():
        if name in grads.forward:
            grads.forward[name].gradients = slots
    return grads.forward, grads


def _reference_run(
    ref_cap: Capture, model: ModelInputs, weights: tuple[int, Path | None, bool],
    modules: dict[str, str | None], kinds: dict[str, str], analysis: tuple[str, Any],
    progress: Progress, seconds: dict[str, float],
) -> tuple[dict[str, NodeRange], GradientRun | None, str]:  # fmt: skip
    """Make the weights (``weights``: seed, folder, whether one at a time) and run the reference;
    its ranges, gradients, and where the weights came from. Shards stay open for the run."""
    seed, weights_dir, streaming = weights
    pass_, loss = analysis
    with ShardPool() as pool:
        t0 = time.perf_counter()
        _note(progress, "checking the weights (read one at a time in the run)" if streaming
              else "materialising fp32 weights on the CPU")  # fmt: skip
        values, source = _reference_values(ref_cap, model, seed, weights_dir,
                                           pool if streaming else None)  # fmt: skip
        seconds["materialise"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        both = " (forward and backward)" * (pass_ == "train")
        _note(progress, f"running the model in fp32 on the CPU{both}")
        measured, grads = _measure(ref_cap, values, modules, kinds, pass_, loss, seed)
        del values
        seconds["run"] = time.perf_counter() - t0
    return measured, grads, source


def _train_verdicts(
    result: RangesResult, grads: GradientRun | None, ref_nodes: list[NodeRecord],
    measured: dict[str, NodeRange], loss: str | int | None,
) -> None:  # fmt: skip
    """Add each setting's gradient findings and loss scale, and the run's own, to ``result``."""
    from ampgraph.ranges.gradients import judge_gradients, loss_scale
    from ampgraph.train.backward import LOSS_EXPRESSION

    if grads is None:
        return
    result.pass_ = "train"
    result.loss = {"output": grads.loss_output, "expression": LOSS_EXPRESSION,
                   "value": grads.loss if math.isfinite(grads.loss) else str(grads.loss)}
    result.parameter_gradients = grads.parameters
    every = [
        (f"{measured[n].op.removeprefix('aten.').split('.')[0]} in {measured[n].module} ({n})"
         if n in measured and measured[n].module else n, g)
        for n, slots in grads.nodes.items() for g in slots if g is not None
    ]  # fmt: skip
    result.loss_scale = loss_scale(every + list(grads.parameters.items()))
    for verdict, report in zip(result.settings, result.reports):
        found, verdict.loss_scale = judge_gradients(report, ref_nodes, measured, grads.parameters)
        verdict.findings += found


def _model_of(model: Any, *, seq_len: int, force: bool) -> ModelInputs:
    """What :func:`value_ranges` takes as a model: a :class:`ModelInputs`, or a model spec
    (``"llama-tiny"``, a :class:`~ampgraph.model.specs.ModelSpec`) built as
    :func:`ampgraph.load_model` builds it."""
    from ampgraph.errors import ArgumentError
    from ampgraph.model.specs import ModelSpec

    if isinstance(model, ModelInputs):
        return model
    if isinstance(model, (str, ModelSpec)):  # load_model checks seq_len
        from ampgraph.model.build import load_model

        return load_model(model, seq_len=seq_len, force=force)
    raise ArgumentError(f"value_ranges() takes a model spec such as 'llama-tiny' or what "
                        f"load_model() returns, not {type(model).__name__}")  # fmt: skip


def value_ranges(
    model: ModelInputs | str,
    settings: Sequence[Setting | str] | Setting | str,
    *,
    device_type: str = "cuda",
    amp_dtype: str = "bf16",
    seed: int | None = None,
    weights_dir: Path | str | None = None,
    seq_len: int = 8,
    force: bool | None = None,
    progress: Progress = None,
    pass_: str = "forward",
    loss: str | int | None = None,
    stream: bool | None = None,
) -> RangesResult:
    """Run ``model`` once for real in fp32 on the CPU and judge its values in each setting.

    ``model`` is what :func:`ampgraph.load_model` returns, or a model spec it takes (built with
    ``seq_len``). ``settings`` are :class:`~ampgraph.settings.Setting` objects or names (parsed
    with ``device_type`` and ``amp_dtype``), or one of them; ``seed`` an integer of 64 bits at
    most. Arguments are checked first (:mod:`ampgraph.arguments`). Weights: see
    :mod:`ampgraph.ranges.weights`; ``weights_dir`` is a folder of ``*.safetensors`` shards. A
    model whose fp32 weights do not fit this machine's memory is read one weight at a time from
    such a folder, else a one-line :class:`RangesError` unless ``force``. ``pass_`` "train" traces the model in training mode, runs the train pass's loss (``loss`` names its output)
    backward for real too, and judges each gradient in its dtype (:mod:`ampgraph.ranges.gradients`).
    ``stream`` runs one weight at a time from ``weights_dir``'s shards (:mod:`ampgraph.ranges.
    stream`; by default, None, where the fp32 weights do not fit in memory): the same results.

    ``seed``, ``weights_dir``, ``force`` and ``stream`` left None are the analysis environment's
    (:class:`~ampgraph.capture.environment.RealRun`: the request's, where
    :func:`ampgraph.ranges.spec_run.ranges_of_spec` runs it; seed 0, no folder, not forced and
    streamed where needed outside one); given, they are this run's.
    """
    import ampgraph.arguments as arguments

    arguments.integer("seq_len", seq_len, minimum=1)  # checked whatever the model is
    if pass_ not in ("forward", "train"):
        raise RangesError(f"unknown pass {pass_!r} for ranges: use forward or train")
    parsed = list(arguments.settings(settings, device_type=device_type, amp_dtype=amp_dtype))
    environment = current().run_given(
        seed=None if seed is None else arguments.seed(seed), force=force, stream=stream,
        weights_dir=arguments.path("weights_dir", weights_dir),
    )  # fmt: skip
    with analysis_environment(environment):
        return _value_ranges(model, parsed, seq_len, progress, pass_, loss)


def _value_ranges(
    model: ModelInputs | str, parsed: list[Setting], seq_len: int, progress: Progress,
    pass_: str, loss: str | int | None,
) -> RangesResult:  # fmt: skip
    """:func:`value_ranges` once its arguments are checked, inside its environment, whose
    :class:`~ampgraph.capture.environment.RealRun` says what the real run may do."""
    from ampgraph.version import __version__

    run = current().real_run
    model = _model_of(model, seq_len=seq_len, force=run.force)
    streaming = should_stream(model.module, run.weights_dir, train=pass_ == "train",
                              force=run.force, asked=run.stream)  # fmt: skip
    if not streaming:
        check_memory(model.module, model.name, force=run.force, gradients=pass_ == "train")
    seconds: dict[str, float] = {}
    training, analysis = pass_ == "train", {"pass_": pass_, "loss": loss}
    t0 = time.perf_counter()
    reference = Setting.parse("fp32,inputs=fp32", device_type=parsed[0].device_type)
    _note(progress, "capturing the fp32 reference graph")
    ref_cap = capture(model, reference, training=training)
    ref_report = analyze_capture(ref_cap, check=False, **analysis)
    reports = []
    for i, setting in enumerate(parsed, 1):
        _note(progress, f"analysing {setting.name} ({i} of {len(parsed)})")
        cap = ref_cap if setting == reference else capture(model, setting, training=training)
        report = ref_report if cap is ref_cap else analyze_capture(cap, check=False, **analysis)
        reports.append((report, graph_constants(cap.graph_module)))
    seconds["capture_annotate"] = time.perf_counter() - t0

    modules = {r.name: r.module for r in ref_report.nodes}
    kinds = {r.name: r.kind for r in ref_report.nodes}
    measured, grads, source = _reference_run(
        ref_cap, model, (run.seed, run.weights_dir, streaming), modules, kinds, (pass_, loss),
        progress, seconds,
    )  # fmt: skip

    verdicts = [judge_setting(rep, ref_report.nodes, measured, consts) for rep, consts in reports]
    ordered = [measured[r.name] for r in ref_report.nodes if r.name in measured]
    ordered += [n for name, n in measured.items() if name not in modules]  # region bodies
    result = RangesResult(
        model=model.name,
        weights=source,
        seed=run.seed,
        reference=reference.to_dict(),
        nodes=ordered,
        settings=verdicts,
        reference_findings=reference_findings(ref_report.nodes, measured),
        versions={"ampgraph": __version__, "torch": torch.__version__},
        seconds={k: round(v, 3) for k, v in seconds.items()},
        reports=[rep for rep, _ in reports],
    )
    for verdict in verdicts:
        verdict.inherited = result.reference_errors
    _train_verdicts(result, grads, ref_report.nodes, measured, loss)
    return result


__all__ = [
    "KINDS",
    "LIMITS",
    "NodeRange",
    "RangeFinding",
    "RangesError",
    "RangesResult",
    "SettingRanges",
    "ValueRange",
    "value_ranges",
]
