"""Capture: trace a model into a torch.fx graph of ATen ops, once per setting.

The graph is traced *in* the setting (parameters in its dtype, fake tensors on its device, autocast
enabled when the setting says so), so that every dtype the model code reads at trace time
(``x.to(q.dtype)``) is baked in as a real run would see it. ``torch.export`` records the ops as
called, before autocast rewrites them, so the graph says ``aten.linear`` and leaves it to the
annotator to say what autocast does there.

Where fake CUDA tensors cannot be traced (a CPU-only build of torch) the model is traced on the
meta device without autocast instead, and the nodes that carry trace-time dtype constants are
listed in :attr:`Capture.trace_time_dtype_nodes`: their dtypes are those of the plain run.

>>> from ampgraph.model.build import load_model
>>> from ampgraph.settings import Setting
>>> cap = capture(load_model("llama-tiny"), Setting.parse("amp-fp32"))
>>> cap.method, sum(node.op == "placeholder" for node in cap.graph_module.graph.nodes)
('make-fx', 26)
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from ampgraph.capture.environment import in_analysis_environment
from ampgraph.capture.casts import cast_outputs
from ampgraph.capture.data_path import (
    DATA_PATH_METHODS,
    DRAFT_EXPORT,
    EXPORT_DATA_PATH,
    branches_on_data,
    trace_data_path,
)
from ampgraph.capture.engines import (
    ENGINES,
    EXPORT,
    MAKE_FX,
    Traced,
    _export,
    make_fx_available,
)
from ampgraph.capture.grad_params import mark_requires_grad
from ampgraph.capture.module_io import NO_TENSOR, ModuleIORecorder, error_line, modules_kept
from ampgraph.capture.outputs import output_paths
from ampgraph.capture.raises import as_a_real_run, on_a_real_run
from ampgraph.capture.retrace import (
    OnARealRunPath,
    autograd_refused,
    past_python_raise,
    real_run_why,
)
from ampgraph.capture.reads import TraceReads, drop_past_raise
from ampgraph.errors import CaptureError, exception_chain
from ampgraph.model.build import ModelInputs
from ampgraph.settings import Setting
from ampgraph.torchutil import (
    can_trace_fake,
    fake_device_built,
    simulated_cuda_amp,
    torch_dtype,
    traced_grad_mode,
)

#: The methods that trace the model in its setting, so that trace-time dtype reads are the
#: setting's own; the other methods trace once in a neutral setting and replay.
IN_SETTING = (MAKE_FX, EXPORT)
EXPORT_META_REPLAY = "export-meta-replay"
#: Traced with fp32 parameters and no autocast because the model raises in its setting (the
#: ``half`` setting of a model fed fp32 inputs, an op autocast does not cover fed mixed dtypes),
#: then replayed with the setting's dtypes and autocast.
EXPORT_RETYPED = "export-retyped"


@dataclass(frozen=True)
class ModuleInfo:
    """What the capture knows of one submodule: its class and base classes, and if it is a leaf."""

    path: str
    type: str
    bases: tuple[str, ...]
    is_leaf: bool


@dataclass
class Capture:
    """A traced graph plus what later stages need to replay it without the model object."""

    model_name: str
    setting: Setting
    graph_module: fx.GraphModule
    method: str
    #: placeholder name -> ("parameter" | "buffer" | "constant" | "input", qualified target).
    input_kinds: dict[str, tuple[str, str]]
    modules: dict[str, ModuleInfo]
    trace_time_dtype_nodes: list[str] = field(default_factory=list)
    #: leaf-module path -> per call, the graph nodes of its first input and first output (as a
    #: forward hook's ``inp[0]`` and ``out[0]``), None where a value is not a graph node, and
    #: :data:`NO_TENSOR` where it is no tensor at all (the hook prints ``None``).
    module_io: dict[str, list[tuple[str | None, str | None]]] = field(default_factory=dict)
    #: Where the tracer decided a branch on a dtype at its own trace time (see GraphForward).
    dtype_branches: list[str] = field(default_factory=list)
    #: Every leaf-module call in the order the forward made them, as (path, call index, whether
    #: the call added no node to the graph). An ``nn.Identity`` or an eval-mode
    #: ``StochasticDepth`` returns its input: a hook fires, yet the graph has nothing of it.
    call_order: list[tuple[str, int, bool]] = field(default_factory=list)
    #: Branches the forward took on data values while ``draft-export`` traced it, one line each
    #: (``boxes.py:103 if boxes.numel() == 0: Eq(4*u1, 0) decided False``): the graph is the path
    #: those example values take, and the other side of each is not analysed.
    data_dependent: list[str] = field(default_factory=list)
    #: The value each data-dependent size took on that path, by symbol (``{"u1": 1000}``):
    #: what :func:`ampgraph.torchutil.unbacked_values` gives another tracer (the eager hooks) to follow it too.
    unbacked_values: dict[str, int | float] = field(default_factory=dict)
    #: Where each of the graph's outputs sits in what the model returns: ``logits``, ``0``,
    #: ``past_key_values.0.1`` (a backward pass picks the output its loss reduces by it).
    output_paths: list[str] = field(default_factory=list)
    #: Traced with ``model.train()`` (dropout active, batch norm on batch statistics), as a
    #: training step runs; the forward analysis traces the model as given (``eval()``).
    training: bool = False
    #: Tied parameters: each alias's name -> the name ``named_parameters()`` lists it under.
    tied: dict[str, str] = field(default_factory=dict)
    #: What the traced code read of the setting (:mod:`ampgraph.capture.reads`), for deciding which other
    #: settings this graph serves; None where no such log was kept (a meta-device capture).
    reads: list[Any] | None = None
    #: The setting the graph was traced in, where it serves another setting (see
    #: :func:`ampgraph.pipeline.stages.analyze_group`); None for a graph traced in its own setting.
    graph_of: str | None = None
    #: Where the forward raised when traced in its own setting, for a graph traced again with
    #: fp32 parameters (``export-retyped``): the error, how many leaf calls had begun, and the
    #: innermost leaf call open when it raised (``[path, index]``, or None). A prediction that
    #: runs past that point without an error contradicts it (see :mod:`ampgraph.annotate.check`).
    raised_in_setting: dict[str, Any] | None = None
    #: Why the graph is the path a real run takes rather than export's (see
    #: :func:`ampgraph.capture.raises.as_a_real_run`); None where it is export's.
    real_run: str | None = None


def module_table(module: nn.Module) -> dict[str, ModuleInfo]:
    """Every submodule's class, base classes (for ``--only Linear``-style filters) and leafness."""
    out: dict[str, ModuleInfo] = {}
    # A shared module has several paths (transformers 4.x T5's ``shared`` is also
    # ``encoder.embed_tokens``). Traces record a call under the path it was made through, but a
    # hook registered by iterating named_modules(), as the seed notebook does, prints the first
    # path for every call: each alias maps to that one name.
    canonical = {id(mod): path for path, mod in module.named_modules()}
    for path, mod in module.named_modules(remove_duplicate=False):
        cls = type(mod)
        bases = tuple(c.__name__ for c in cls.__mro__ if issubclass(c, nn.Module))
        out[path] = ModuleInfo(
            path=canonical.get(id(mod), path),
            type=f"{cls.__module__}.{cls.__qualname__}",
            bases=bases,
            is_leaf=next(iter(mod.children()), None) is None,
        )
    return out


def _dtype_constant_nodes(gm: fx.GraphModule) -> list[str]:
    names = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or "_assert_tensor_metadata" in str(node.target):
            continue
        leaves = pytree.tree_leaves((node.args, node.kwargs))
        if any(isinstance(leaf, torch.dtype) and leaf.is_floating_point for leaf in leaves):
            names.append(node.name)
    return names


def _raised_by_a_kernel(exc: BaseException) -> bool:
    """Whether export failed because an op raised (a dtype error), not because of tracing.

    Kernels raise plain ``RuntimeError`` for mismatched dtypes and ``NotImplementedError`` for
    a dtype they have no kernel for (the CPU FFT's "Unsupported dtype BFloat16"); the tracers'
    own failures are subclasses of these (data-dependent guards, dynamic output shapes).
    """
    return any(type(e) in (RuntimeError, NotImplementedError) for e in exception_chain(exc))


def _retrace_neutral(
    model: ModelInputs,
    setting: Setting,
    recorder: ModuleIORecorder,
    exc: Exception,
    reads: TraceReads | None = None,
    engine: str = MAKE_FX,
) -> Traced:
    """Trace again with fp32 parameters and autocast off, when an op raised in ``setting``.

    The forward of the ``half`` setting of a model fed fp32 inputs raises at its first layer on a
    GPU (and in the fake kernels that check it): that is the finding, and it belongs at that node,
    not in a failed capture. The graph is the same in any dtype unless the model reads dtypes
    while tracing; those nodes are listed (``trace_time_dtype_nodes``) as for meta captures.
    """
    if not _raised_by_a_kernel(exc) or (setting.param_dtype == "float32" and not setting.autocast):
        raise exc
    recorder.reset()
    if reads is not None:
        reads.clear()  # the failed trace's reads are not this graph's
    # A recipe's output cast, recorded whatever the neutral trace's dtypes: the replay's are
    # the setting's.
    with cast_outputs(model.module, setting, every=True):
        return ENGINES[engine](model, setting.device_type, torch.float32, None, reads)


def _trace_past_raise(
    model: ModelInputs,
    setting: Setting,
    recorder: ModuleIORecorder,
    exc: Exception,
    reads: TraceReads | None,
    engine: str,
) -> Any:
    """Trace again in ``setting``, on past the op that raised (:meth:`TraceReads._call`).

    The graph is the setting's own up to that op, every dtype the code read there included
    (``x.to(self.weight.dtype)``), and the op is in it as the model called it: the annotation
    and the check find the error where a real run raises it (issue 25).
    """
    if reads is None or not _raised_by_a_kernel(exc):
        raise exc
    recorder.reset()
    reads.clear()
    reads.past_raise = True
    try:
        dtype = torch_dtype(setting.param_dtype)
        program = ENGINES[engine](model, setting.device_type, dtype, setting, reads)
    finally:
        reads.past_raise = False
    drop_past_raise(program.graph_module)
    return program


def _retype_parameters(
    gm: fx.GraphModule, kinds: dict[str, tuple[str, str]], setting: Setting
) -> None:
    """Give floating parameter, buffer and input placeholders the setting's dtypes: its
    parameter dtype, as ``Module.to(dtype)`` does, and a recipe's buffer and input dtypes."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op != "placeholder" or not isinstance(val, torch.Tensor):
            continue
        kind = kinds.get(node.name, ("input",))[0]
        name = setting.floating_dtype(kind) if kind in ("parameter", "buffer", "input") else None
        if name is not None and val.is_floating_point():
            node.meta["val"] = torch.empty(val.shape, dtype=torch_dtype(name), device="meta")


def _traced_by(model: ModelInputs) -> tuple[str, tuple[str, ...]]:
    """:func:`ampgraph.capture.tracers.traced_by`, without importing that module for the default
    tracer: where it was never imported, no tracer but export can have made the model."""
    tracers = sys.modules.get("ampgraph.capture.tracers")
    return tracers.traced_by(model) if tracers is not None else (EXPORT, ())


def _check_fake_device(device_type: str) -> None:
    """One line where this build cannot trace fake ``device_type`` tensors
    (:func:`~ampgraph.torchutil.fake_device_built`); the analysis traces such a setting on CUDA
    instead (:func:`ampgraph.pipeline.stages.traced_setting`), a run (``verify``) cannot."""
    if not fake_device_built(device_type):
        raise CaptureError(
            f"torch {torch.__version__} is built without {device_type}: fake {device_type} "
            "tensors run its autocast kernels but not views, so no model can be traced or run "
            f"on it here; 'ampgraph table --device {device_type}' predicts it from its lists on "
            f"a CUDA trace, and a torch built with {device_type} verifies it"
        )


@contextlib.contextmanager
def training_mode(module: nn.Module, training: bool) -> Iterator[None]:
    """``module.train(training)`` for a while; every submodule's own flag comes back after."""
    flags = [(m, m.training) for m in module.modules()]
    module.train(training)
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


@dataclass
class _Found:
    """What tracing found, before it is a :class:`Capture`: the program and how it was made."""

    program: Any
    method: str
    #: What the traced code read of the setting; None for a graph that serves its own only.
    reads: TraceReads | None
    data_dependent: list[str] = field(default_factory=list)
    unbacked: dict[str, int | float] = field(default_factory=dict)
    raised: dict[str, Any] | None = None
    real_run: str | None = None


@in_analysis_environment
def capture(
    model: ModelInputs,
    setting: Setting,
    *,
    training: bool = False,
    engine: str | None = None,
) -> Capture:
    """Trace ``model`` in ``setting`` and return the graph with what replaying it needs.

    ``training`` traces it in training mode (``model.train()``), as a training step runs it;
    otherwise in the mode it is in (the bundled models are in ``eval()`` mode). ``engine`` (default:
    the model's own, ``make-fx`` unless :func:`ampgraph.pipeline.stages.trace` said otherwise) is
    ``make-fx`` or ``export``: the same graph, traced by ``make_fx`` with export's passes or by
    ``torch.export.export`` itself (``--tracer export``). A graph an FX tracer made is always
    lowered by export. The forward is traced in the grad mode a real run of the pass has,
    whatever the caller's (:func:`~ampgraph.torchutil.forward_grad_mode`): inference under
    ``torch.inference_mode()``, a training step with grad on.
    """
    engine = engine or model.engine
    if engine not in ENGINES:
        raise CaptureError(f"unknown capture engine {engine!r}: use one of {', '.join(ENGINES)}")
    _check_fake_device(setting.device_type)
    if engine == MAKE_FX and not make_fx_available():
        engine = EXPORT
    tracer, dtype_branches = _traced_by(model)
    if tracer != EXPORT:
        engine = EXPORT
    recorder = ModuleIORecorder(model.module)
    # A forward may rebuild the model (BigBird's first forward on a short sequence switches to
    # full attention, new modules): the model is left as it was, so that the next forward (the
    # real run's, the eager hooks') takes the first forward's path, as this trace did.
    with modules_kept(model.module):
        try:
            found = _trace(model, setting, recorder, engine, training)
        except OnARealRunPath as switch:  # export's path raised where a real run's does not
            return _on_a_real_run_path(model, setting, training, engine, switch.why)
        except CaptureError:
            raise
        except Exception as exc:  # export raises many types; all mean "this model did not trace"
            return _after_failure(model, setting, training, engine, exc)
        return _assemble(model, setting, found, recorder, tracer, dtype_branches, training)


def _trace(
    model: ModelInputs, setting: Setting, recorder: ModuleIORecorder, engine: str,
    training: bool,
) -> _Found:  # fmt: skip
    """The graph of ``model`` in ``setting``, in the mode a training step or inference runs
    it, with the module calls ``recorder`` records."""
    mode = training_mode(model.module, True) if training else contextlib.nullcontext()
    # The grad mode a real run of the pass has, whatever the caller's: inference_mode for the
    # forward (the seed notebook's, users' and verify's), grad on for a training step. Model
    # code branches on it (an MoE router's ``if not torch.is_grad_enabled():`` fast path), so
    # a graph traced in another mode is another model's.
    with recorder, mode, traced_grad_mode(training):
        if can_trace_fake(setting.device_type):
            return _trace_fake(model, setting, recorder, engine)
        return _trace_on_meta(model, setting)


def _trace_fake(
    model: ModelInputs, setting: Setting, recorder: ModuleIORecorder, engine: str
) -> _Found:
    """Traced in the setting on its fake tensors; where that raises, the way on that fits
    (:func:`_after_raise`)."""
    reads = TraceReads()
    try:
        dtype = torch_dtype(setting.param_dtype)
        program = ENGINES[engine](model, setting.device_type, dtype, setting, reads)
    except Exception as exc:  # noqa: BLE001 - maybe the model's own dtype error
        return _after_raise(model, setting, recorder, exc, reads, engine)
    return _Found(program, engine, reads)


def _after_raise(
    model: ModelInputs, setting: Setting, recorder: ModuleIORecorder, exc: Exception,
    reads: TraceReads, engine: str,
) -> _Found:  # fmt: skip
    """The graph where the trace in the setting raised ``exc``: on a real run's path past a
    Python raise, on past the op that raised, retyped to fp32, or along the data's path."""
    if branches_on_data(exc):
        return _data_path(model, setting, recorder)
    found = past_python_raise(model, setting, recorder, exc, reads, engine)
    if found is not None:
        program, real_run = found
        return _Found(program, engine, reads, real_run=real_run)
    raised = recorder.raised(exc)
    try:
        program = _trace_past_raise(model, setting, recorder, exc, reads, engine)
    except Exception:  # noqa: BLE001 - it cannot: fp32 parameters, as before
        program = None
    if program is not None:
        return _Found(program, engine, reads, raised=raised)
    try:
        program = _retrace_neutral(model, setting, recorder, exc, reads, engine)
    except Exception as again:  # the same rule again
        # The half setting of a detector: its first layer raises, and the
        # neutral trace then stops where the forward branches on data.
        if again is exc or not branches_on_data(again):
            raise
        return _data_path(model, setting, recorder)
    return _Found(program, EXPORT_RETYPED, reads, raised=raised)


def _data_path(model: ModelInputs, setting: Setting, recorder: ModuleIORecorder) -> _Found:
    """:func:`~ampgraph.capture.data_path.trace_data_path`: traced on data values, this graph
    serves its setting only (no reads)."""
    program, method, data_dependent, unbacked = trace_data_path(model, setting, recorder)
    return _Found(program, method, None, data_dependent, unbacked)


def _trace_on_meta(model: ModelInputs, setting: Setting) -> _Found:
    """Traced on the meta device without autocast, for a replay in the setting: the same
    graph for the whole group (no reads)."""
    # Traced on meta, but a torch.autocast("cuda") region in the model still means
    # what it does on a GPU: do not let it disable itself for want of one.
    with (
        simulated_cuda_amp(setting.device_type),
        cast_outputs(model.module, setting, every=True),
    ):
        # Autocast off, and the output cast recorded above: the setting's tensors.
        tensors = replace(setting, autocast=False, output_dtype=None)
        program = _export(model, "meta", torch_dtype(setting.param_dtype), tensors)
    return _Found(program, EXPORT_META_REPLAY, None)


def _after_failure(
    model: ModelInputs, setting: Setting, training: bool, engine: str, exc: Exception,
) -> Capture:  # fmt: skip
    """Where no trace took the model (``exc``): traced on a real run's path where that is what
    it needs, else a :class:`CaptureError` in one line."""
    traced_by_make_fx = engine == MAKE_FX and can_trace_fake(setting.device_type)
    failed = CaptureError(
        f"{'make_fx' if traced_by_make_fx else 'torch.export'} could not trace {model.name!r}: "
        f"{error_line(exc)} (make the forward traceable, or pass example inputs it accepts)"
    )
    if autograd_refused(exc) and training:  # a training step raises it too: the finding
        raise CaptureError(
            f"{model.name!r} cannot run its forward with gradients, as a training step "
            f"does: {error_line(exc)} (the forward pass, --pass forward, is analysed "
            "as inference runs it, under torch.inference_mode())"
        ) from None
    if on_a_real_run():
        raise failed from exc
    try:  # export's path may be what raised (a mask a real run never builds): a real run's
        why = real_run_why(exc)
        return _on_a_real_run_path(model, setting, training, engine, why)
    except CaptureError:
        raise failed from exc


def _assemble(
    model: ModelInputs, setting: Setting, found: _Found, recorder: ModuleIORecorder,
    tracer: str, dtype_branches: Sequence[str], training: bool,
) -> Capture:  # fmt: skip
    """The :class:`Capture` of what tracing ``found``."""
    program, method = found.program, found.method
    kinds: dict[str, tuple[str, str]] = {}
    for spec in program.signature.input_specs:
        arg_name = getattr(spec.arg, "name", None)
        if arg_name is None:
            continue
        kind = {
            "PARAMETER": "parameter",
            "BUFFER": "buffer",
            "CONSTANT_TENSOR": "constant",
            "USER_INPUT": "input",
        }.get(spec.kind.name, spec.kind.name.lower())
        kinds[arg_name] = (kind, spec.target or arg_name)
    gm = program.graph_module
    mark_requires_grad(gm, kinds, model.module)  # matmul folds by it (capture/grad_params)
    if method in (EXPORT_RETYPED, DRAFT_EXPORT, EXPORT_META_REPLAY):
        _retype_parameters(gm, kinds, setting)
    return Capture(
        model_name=model.name,
        setting=setting,
        graph_module=gm,
        # A tracer other than export traced the graph that export lowered: "hf-fx+export".
        method=method if tracer == EXPORT else f"{tracer}+{method}",
        input_kinds=kinds,
        modules=module_table(model.module),
        trace_time_dtype_nodes=(
            _dtype_constant_nodes(gm) if method not in (*IN_SETTING, EXPORT_DATA_PATH) else []
        ),
        module_io=recorder.resolve(gm),
        call_order=recorder.call_order(),
        dtype_branches=list(dtype_branches),
        data_dependent=found.data_dependent,
        unbacked_values=(
            found.unbacked if method in DATA_PATH_METHODS else getattr(program, "unbacked", {})
        ),
        output_paths=output_paths(program.out_spec),
        training=training,
        tied=tied_parameters(model.module),
        reads=found.reads.resolved(gm) if found.reads is not None else None,
        raised_in_setting=found.raised if method == EXPORT_RETYPED else None,
        real_run=found.real_run,
    )


def _on_a_real_run_path(
    model: ModelInputs, setting: Setting, training: bool, engine: str, why: str,
) -> Capture:  # fmt: skip
    """:func:`capture` again, every trace on a real run's path (:func:`as_a_real_run`)."""
    with as_a_real_run():
        on_path = capture(model, setting, training=training, engine=engine)
    on_path.real_run = why
    return on_path


def tied_parameters(module: nn.Module) -> dict[str, str]:
    """Every alias of a tied parameter -> its first name, as ``named_parameters()`` gives it.

    >>> m = nn.Sequential(nn.Embedding(3, 2), nn.Linear(2, 3, bias=False))
    >>> m[1].weight = m[0].weight
    >>> tied_parameters(m)
    {'1.weight': '0.weight'}
    """
    first: dict[int, str] = {}
    out = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in first:
            out[name] = first[id(p)]
        else:
            first[id(p)] = name
    return out


# NO_TENSOR and the engines' names are the capture stage's to give its
# callers, whichever module of it defines them.
__all__ = [
    "DATA_PATH_METHODS",
    "DRAFT_EXPORT",
    "EXPORT",
    "EXPORT_DATA_PATH",
    "EXPORT_META_REPLAY",
    "EXPORT_RETYPED",
    "IN_SETTING",
    "MAKE_FX",
    "NO_TENSOR",
    "Capture",
    "ModuleInfo",
    "capture",
    "module_table",
    "output_paths",
    "tied_parameters",
    "training_mode",
]
