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
>>> cap.method, len(cap.graph_module.graph.nodes)
('make-fx', 192)
"""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree

from ampgraph.errors import CaptureError, first_line
from ampgraph.model.build import ModelInputs
from ampgraph.capture.reads import TraceReads
from ampgraph.settings import Setting
from ampgraph.torchutil import (
    autocast_state,
    can_trace_fake,
    quiet_logging,
    simulated_cuda_amp,
    swapped_tensors,
    torch_dtype,
    unbacked_values,
)

EXPORT = "export"
#: The default: the graph ``torch.export`` makes, traced by ``make_fx`` with export's own passes
#: and without the rest of export (see :func:`_make_fx`), in about half the time.
MAKE_FX = "make-fx"
#: The methods that trace the model in its setting, so that trace-time dtype reads are the
#: setting's own; the other methods trace once in a neutral setting and replay.
IN_SETTING = (MAKE_FX, EXPORT)
EXPORT_META_REPLAY = "export-meta-replay"
#: Traced with fp32 parameters and no autocast because the model raises in its setting (the
#: ``half`` setting of a model fed fp32 inputs, an op autocast does not cover fed mixed dtypes),
#: then replayed with the setting's dtypes and autocast.
EXPORT_RETYPED = "export-retyped"
#: A forward that branches on data (a detection model's ``if boxes.numel() == 0`` after NMS)
#: cannot be traced on fake tensors, which have no values. Traced instead by
#: ``torch.export.draft_export`` on real, seeded random weights and inputs on the CPU, with fp32
#: parameters and no autocast; each branch on data is decided as those values decide it (listed
#: in :attr:`Capture.data_dependent`), then replayed in the setting like ``export-retyped``.
DRAFT_EXPORT = "draft-export"
#: A forward that branches on data, traced in its setting like ``export`` (fake tensors of the
#: setting's device and dtypes, autocast on), with each size that depends on data given the value
#: the ``draft-export`` run found for it: every branch on data is decided as that run decided it
#: (:attr:`Capture.data_dependent`), and every dtype the code reads at trace time is the
#: setting's own, which a retyped fp32 trace cannot give (a detector's anchors follow its
#: feature maps' dtype). Where that trace raises (the ``half`` setting's first layer), the
#: ``draft-export`` graph is replayed instead.
EXPORT_DATA_PATH = "export-data-path"
#: Every method that decides branches on data (the report lists the branches).
DATA_PATH_METHODS = (DRAFT_EXPORT, EXPORT_DATA_PATH)


#: In :attr:`Capture.module_io`: the hook's value is no tensor (a detector's ``transform`` takes a
#: list of images and returns an ``ImageList``), so its hook prints ``None``; not "unknown".
NO_TENSOR = ""


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
    unbacked_values: dict[str, int] = field(default_factory=dict)
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


#: Whether captures record each node's Python stack (``node.meta["stack_trace"]``), which
#: :mod:`ampgraph.review.sources` reads source lines from: only while :func:`keeping_stack_traces` lasts.
_STACK_TRACES = False


@contextlib.contextmanager
def keeping_stack_traces() -> Iterator[None]:
    """Captures made while it lasts record each node's stack trace (``analyze(...,
    sources=True)``, for audit's source lines); the others skip it (:func:`_no_stack_traces`)."""
    global _STACK_TRACES
    previous, _STACK_TRACES = _STACK_TRACES, True
    try:
        yield
    finally:
        _STACK_TRACES = previous


@contextlib.contextmanager
def _no_stack_traces() -> Iterator[None]:
    """Skip recording a Python stack trace per node unless :func:`keeping_stack_traces` asks for
    them: only audit's source lines read them, and symbolising them is a sixth of the trace time."""
    import torch.fx.config as fx_config

    previous = fx_config.do_not_emit_stack_traces
    fx_config.do_not_emit_stack_traces = not _STACK_TRACES
    try:
        yield
    finally:
        fx_config.do_not_emit_stack_traces = previous


@contextlib.contextmanager
def _lift_scalar_constants() -> Iterator[None]:
    """Trace ``torch.tensor(scalar, device=x.device)`` as a lifted constant plus a copy op.

    By default export computes ops on one-element constants for real, on their device: with fake
    CUDA tensors and no GPU that needs a CUDA driver (transformers 4.x's eager attention does
    ``torch.tensor(torch.finfo(dtype).min, device=...)``). Lifting them leaves the graphs of models
    without such constants unchanged.
    """
    from torch.fx.experimental import proxy_tensor

    previous = proxy_tensor.CONSTANT_NUMEL_LIMIT
    proxy_tensor.CONSTANT_NUMEL_LIMIT = 0
    try:
        yield
    finally:
        proxy_tensor.CONSTANT_NUMEL_LIMIT = previous


def _fake_like(fake_mode: FakeTensorMode, device: str, dtype_for: Any) -> Any:
    def make(t: torch.Tensor) -> torch.Tensor:
        with fake_mode:
            return torch.empty(t.shape, dtype=dtype_for(t), device=device)

    return make


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(exc, default='')}".rstrip(": ")


@dataclass
class Traced:
    """What a tracing engine gives the capture: the graph, its inputs' kinds and outputs' tree."""

    graph_module: fx.GraphModule
    signature: Any  # torch.export.ExportGraphSignature
    out_spec: pytree.TreeSpec | None


def _fake_inputs(
    model: ModelInputs, fake_mode: FakeTensorMode, device: str, param_dtype: torch.dtype | None
) -> Any:
    def param_dtype_for(t: torch.Tensor) -> torch.dtype:
        # Module.to(dtype) converts floating-point parameters and buffers only.
        return param_dtype if (param_dtype is not None and t.is_floating_point()) else t.dtype

    make_param = _fake_like(fake_mode, device, param_dtype_for)
    make_input = _fake_like(fake_mode, device, lambda t: t.dtype)
    args, kwargs = pytree.tree_map_only(torch.Tensor, make_input, (model.args, model.kwargs))
    return make_param, tuple(args), kwargs


@contextlib.contextmanager
def _tracing_context(
    model: ModelInputs,
    device: str,
    setting: Setting | None,
    reads: TraceReads | None,
    make_param: Any,
) -> Iterator[None]:
    """Everything both engines trace under: the setting's fake tensors and autocast state."""
    autocast = (
        autocast_state(device, True, torch_dtype(setting.amp_dtype))
        if setting is not None and setting.autocast
        else contextlib.nullcontext()
    )
    with (
        swapped_tensors(model.module, make_param),
        autocast,
        simulated_cuda_amp(setting.device_type if setting is not None else device),
        warnings.catch_warnings(),
        quiet_logging(),
        _no_stack_traces(),
        _lift_scalar_constants(),
        reads if reads is not None else contextlib.nullcontext(),
        reads.autocast_queries() if reads is not None else contextlib.nullcontext(),
    ):
        warnings.simplefilter("ignore")
        yield


def _export(
    model: ModelInputs,
    device: str,
    param_dtype: torch.dtype | None,
    setting: Setting | None,
    reads: TraceReads | None = None,
) -> Traced:
    """``torch.export.export`` in the setting (the ``export`` tracer)."""
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    make_param, args, kwargs = _fake_inputs(model, fake_mode, device, param_dtype)
    with _tracing_context(model, device, setting, reads, make_param):
        program = torch.export.export(model.module, args, kwargs, strict=False)
    return Traced(program.graph_module, program.graph_signature, program.call_spec.out_spec)


def _make_fx(
    model: ModelInputs,
    device: str,
    param_dtype: torch.dtype | None,
    setting: Setting | None,
    reads: TraceReads | None = None,
) -> Traced:
    """The graph ``torch.export`` makes, traced by ``make_fx`` and export's own passes.

    Non-strict export is pre-dispatch ``make_fx`` over a functional call of the module, with
    module stacks recorded, followed by passes that lift constants, turn autocast and grad-mode
    regions into higher-order ops and name the placeholders. Here the same trace and the same
    passes run without the rest of export's machinery (its torch-function handler, guards,
    verifier and program object), which costs as much again as the trace: the graph is the
    same, node for node (``tests/test_capture_engines.py``), minus export's
    ``_assert_tensor_metadata`` checks, which the replay skips anyway.
    """
    from torch._dispatch.python import enable_python_dispatcher
    from torch._export.passes.lift_constants_pass import ConstantAttrMap, lift_constants_pass
    from torch._export.passes.replace_autocast_with_hop_pass import replace_autocast_with_hop_pass
    from torch._export.passes.replace_set_grad_with_hop_pass import replace_set_grad_with_hop_pass
    from torch._export.utils import _compiling_state_context, placeholder_naming_pass
    from torch.export import graph_signature as sig
    from torch.fx._lazy_graph_module import _use_lazy_graph_module
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from torch.nn.utils.stateless import _reparametrize_module

    # A shape environment, as export has, so that ops with data-dependent output sizes
    # (nonzero, a boolean-mask index) trace with unbacked sizes instead of failing.
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
    make_param, args, kwargs = _fake_inputs(model, fake_mode, device, param_dtype)
    module = model.module
    with _tracing_context(model, device, setting, reads, make_param):
        params = dict(module.named_parameters(remove_duplicate=False))
        buffers = dict(module.named_buffers(remove_duplicate=False))
        names = [*params, *buffers]
        # A tied parameter is one tensor under two names, so every use reads the last alias's
        # placeholder (OPT's embedding reads ``p_lm_head_weight``), as in export's graph.
        state = [*params.values(), *buffers.values()]
        flat_inputs, in_spec = pytree.tree_flatten((args, kwargs))
        out_specs: list[pytree.TreeSpec] = []

        def forward(*flat: Any) -> tuple[Any, ...]:
            call_args, call_kwargs = pytree.tree_unflatten(list(flat[len(names) :]), in_spec)
            tensors = dict(zip(names, flat[: len(names)]))
            with _reparametrize_module(module, tensors, tie_weights=False, strict=False):
                out = module(*call_args, **call_kwargs)
            leaves, spec = pytree.tree_flatten(out)
            out_specs.append(spec)
            return tuple(leaves)

        forward._orig_mod = module  # type: ignore[attr-defined] # make_fx's module-stack root
        # Model code that asks torch.compiler.is_exporting() (transformers' mask builders)
        # takes export's path, as under export.
        with (
            fake_mode,
            enable_python_dispatcher(),
            _compiling_state_context(),
            _use_lazy_graph_module(True),  # see below: nothing runs its code
        ):
            gm = make_fx(forward, record_module_stack=True, pre_dispatch=True)(*state, *flat_inputs)

    _runtime_asserts(gm, fake_mode)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = []
    for i, node in enumerate(placeholders):
        if i < len(params):
            inputs.append(
                sig.InputSpec(sig.InputKind.PARAMETER, sig.TensorArgument(node.name), names[i])
            )
        elif i < len(names):
            inputs.append(
                sig.InputSpec(
                    sig.InputKind.BUFFER, sig.TensorArgument(node.name), names[i], persistent=True
                )
            )
        else:
            value = flat_inputs[i - len(names)]
            arg = (
                sig.TensorArgument(node.name)
                if isinstance(value, torch.Tensor)
                else sig.ConstantArgument(node.name, value)
            )
            inputs.append(sig.InputSpec(sig.InputKind.USER_INPUT, arg, None))
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    outputs = [
        sig.OutputSpec(
            sig.OutputKind.USER_OUTPUT,
            sig.TensorArgument(a.name) if isinstance(a, fx.Node) else sig.ConstantArgument("", a),
            None,
        )
        for a in pytree.tree_leaves(output.args)
    ]
    signature = sig.ExportGraphSignature(inputs, outputs)
    constants = lift_constants_pass(gm, signature, ConstantAttrMap())
    # The region passes split the graph and inline it back, recompiling its Python code each
    # time (a tenth of a second per recompile for a 70B-shaped graph); nothing here runs that
    # code, so each module compiles only if something calls it.
    with _use_lazy_graph_module(True):
        gm, signature = replace_set_grad_with_hop_pass(gm, signature)
        gm, signature = replace_autocast_with_hop_pass(gm, signature)
    # The region passes share meta dicts between graphs: rename each dict once (the old one is
    # kept alive here, so that its id is not reused while this runs).
    renamed: dict[int, tuple[Any, dict[str, Any]]] = {}
    for sub in gm.modules():
        for node in sub.graph.nodes if isinstance(sub, fx.GraphModule) else ():
            if node.op in ("placeholder", "output"):
                node.meta.pop("nn_module_stack", None)
            elif (stack := node.meta.get("nn_module_stack")) and id(stack) not in renamed:
                # export's keys name the root ``L__self__``; make_fx's name it "".
                new = {f"L__self__{k}": v for k, v in stack.items()}
                renamed[id(stack)] = renamed[id(new)] = (stack, new)
                node.meta["nn_module_stack"] = new
            elif stack:
                node.meta["nn_module_stack"] = renamed[id(stack)][1]
    with fake_mode:
        placeholder_naming_pass(
            gm, signature, module, args, kwargs, dict(zip(names, state)), constants
        )
    return Traced(gm, signature, out_specs[-1] if out_specs else None)


class ModuleIORecorder:
    """Remember which graph node each leaf module call received first and returned first.

    A forward hook sees ``inp[0]`` even when the module only reads its dtype or device (Llama's
    rotary embedding takes ``x`` for ``x.dtype``), so the graph alone cannot say what the hook
    would print. Hooks during the trace look up the node that produced each tensor; they record
    graph identities only, never dtypes, so the annotation stays independent of the dispatcher.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.calls: dict[str, list[list[fx.Node | str | None]]] = {}
        #: (path, call index, graph size when the call began or None, whether it added no node)
        self.order: list[list[Any]] = []
        #: The leaf calls begun and not yet returned: where a trace that raises stopped.
        self.open: list[tuple[str, int]] = []
        self._handles: list[Any] = []

    @staticmethod
    def _graph_size() -> int | None:
        from torch.fx.experimental import proxy_tensor

        mode = proxy_tensor.get_proxy_mode()
        graph = getattr(getattr(mode, "tracer", None), "graph", None)
        return len(graph.nodes) if graph is not None else None

    @staticmethod
    def _node_of(value: Any) -> fx.Node | str | None:
        """The node of what a hook prints for ``value`` (its first item if a tuple or list, as
        :func:`ampgraph.verify.hooks.first_dtype` reads it); :data:`NO_TENSOR` if that is no tensor."""
        from torch.fx.experimental import proxy_tensor

        if isinstance(value, (tuple, list)) and value:
            value = value[0]
        if not isinstance(value, torch.Tensor):
            return NO_TENSOR
        mode = proxy_tensor.get_proxy_mode()
        if mode is None:
            return None
        try:
            return proxy_tensor.get_proxy_slot(value, mode.tracer).proxy.node
        except Exception:  # noqa: BLE001 - not a traced tensor: the hook view has no node
            return None

    def __enter__(self) -> ModuleIORecorder:  # noqa: PYI034 - Self needs Python 3.11
        for path, mod in self.module.named_modules():
            if next(iter(mod.children()), None) is not None:
                continue

            def pre(_mod: nn.Module, args: tuple[Any, ...], path: str = path) -> None:
                # The hook's ``inp[0]`` is args[0] itself: a list of images is no tensor.
                first = self._node_of(args) if args else None
                calls = self.calls.setdefault(path, [])
                self.order.append([path, len(calls), self._graph_size(), False])
                self.open.append((path, len(calls)))
                calls.append([first, None])

            def post(_mod: nn.Module, _args: Any, out: Any, path: str = path) -> None:
                self.calls[path][-1][1] = self._node_of(out)
                if self.open and self.open[-1][0] == path:
                    self.open.pop()
                entry = next(e for e in reversed(self.order) if e[0] == path)
                size = self._graph_size()
                entry[3] = size is not None and entry[2] == size

            self._handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()

    def resolve(self, gm: fx.GraphModule) -> dict[str, list[tuple[str | None, str | None]]]:
        """Trace-time nodes -> names in the exported graph (export renames placeholders only)."""
        final = {n.name: n for n in gm.graph.nodes}
        final_placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]

        def name(node: fx.Node | str | None) -> str | None:
            if node is None or isinstance(node, str):
                return node
            if node.op == "placeholder":
                traced = [n for n in node.graph.nodes if n.op == "placeholder"]
                index = traced.index(node)
                return final_placeholders[index].name if index < len(final_placeholders) else None
            match = final.get(node.name)
            return node.name if match is not None and match.target == node.target else None

        return {path: [(name(i), name(o)) for i, o in calls] for path, calls in self.calls.items()}

    def reset(self) -> None:
        """Forget a trace that failed, before the next one runs under the same hooks."""
        self.calls.clear()
        self.order.clear()
        self.open.clear()

    def raised(self, exc: BaseException) -> dict[str, Any]:
        """Where a trace that raised ``exc`` stopped (see :attr:`Capture.raised_in_setting`)."""
        return {
            "error": _first_line(exc),
            "calls_begun": len(self.order),
            "call": list(self.open[-1]) if self.open else None,
        }

    def call_order(self) -> list[tuple[str, int, bool]]:
        """Every leaf call in order, and whether it added no graph node (see Capture)."""
        return [(path, index, empty) for path, index, _size, empty in self.order]


def _dtype_constant_nodes(gm: fx.GraphModule) -> list[str]:
    names = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or "_assert_tensor_metadata" in str(node.target):
            continue
        leaves = pytree.tree_leaves((node.args, node.kwargs))
        if any(isinstance(leaf, torch.dtype) and leaf.is_floating_point for leaf in leaves):
            names.append(node.name)
    return names


def _runtime_asserts(gm: fx.GraphModule, fake_mode: FakeTensorMode) -> None:
    """Export's checks on data-dependent sizes (``_assert_scalar`` on an unbacked size), placed
    as export places them: they are nodes of its graph."""
    from torch._export.passes._node_metadata_hook import (
        _node_metadata_hook,
        _set_node_metadata_hook,
    )
    from torch.fx._utils import first_call_function_nn_module_stack
    from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts

    shape_env = fake_mode.shape_env
    if shape_env is None or torch._dynamo.config.do_not_emit_runtime_asserts:
        return
    where = 'File "torch/fx/passes/runtime_assert.py", line 24, in insert_deferred_runtime_asserts'
    hook = functools.partial(_node_metadata_hook, metadata={"stack_trace": where})
    with _set_node_metadata_hook(gm, hook):
        insert_deferred_runtime_asserts(
            gm,
            shape_env,
            f"exported program: {first_call_function_nn_module_stack(gm.graph)}",
            export=True,
        )


@functools.cache
def make_fx_available() -> bool:
    """Whether this torch has the export passes :func:`_make_fx` runs (private modules that may
    move between releases); where it does not, the capture uses ``torch.export.export``."""
    try:
        from torch._export.passes._node_metadata_hook import _node_metadata_hook  # noqa: F401
        from torch._export.passes.lift_constants_pass import lift_constants_pass  # noqa: F401
        from torch._export.passes.replace_autocast_with_hop_pass import (  # noqa: F401
            replace_autocast_with_hop_pass,
        )
        from torch._export.passes.replace_set_grad_with_hop_pass import (  # noqa: F401
            replace_set_grad_with_hop_pass,
        )
        from torch._export.utils import (  # noqa: F401
            _compiling_state_context,
            placeholder_naming_pass,
        )
        from torch.fx._utils import first_call_function_nn_module_stack  # noqa: F401
        from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts  # noqa: F401
    except ImportError:
        return False
    return True


#: How a model is traced in a setting: ``--tracer make-fx`` (the default) or ``--tracer export``.
ENGINES = {MAKE_FX: _make_fx, EXPORT: _export}


def _raised_by_a_kernel(exc: BaseException) -> bool:
    """Whether export failed because an op raised (a dtype error), not because of tracing.

    Kernels raise plain ``RuntimeError`` for mismatched dtypes and ``NotImplementedError`` for
    a dtype they have no kernel for (the CPU FFT's "Unsupported dtype BFloat16"); the tracers'
    own failures are subclasses of these (data-dependent guards, dynamic output shapes).
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc) in (RuntimeError, NotImplementedError):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


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
    return ENGINES[engine](model, setting.device_type, torch.float32, None, reads)


def _retype_parameters(
    gm: fx.GraphModule, kinds: dict[str, tuple[str, str]], dtype: torch.dtype
) -> None:
    """Give floating parameter and buffer placeholders ``dtype``, as ``Module.to(dtype)`` does."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op != "placeholder" or not isinstance(val, torch.Tensor):
            continue
        if kinds.get(node.name, ("input",))[0] in ("parameter", "buffer") and (
            val.is_floating_point()
        ):
            node.meta["val"] = torch.empty(val.shape, dtype=dtype, device="meta")


def _traced_by(model: ModelInputs) -> tuple[str, tuple[str, ...]]:
    """:func:`ampgraph.capture.tracers.traced_by`, without importing that module for the default
    tracer: where it was never imported, no tracer but export can have made the model."""
    tracers = sys.modules.get("ampgraph.capture.tracers")
    return tracers.traced_by(model) if tracers is not None else (EXPORT, ())


def _branches_on_data(exc: BaseException) -> bool:
    """Whether export failed because the forward branched on a data-dependent value."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, GuardOnDataDependentSymNode) or "data-dependent" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


def _real_like(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A real CPU tensor for a (meta) parameter, buffer or input: small normal floats, zero
    integers (an index in range for any table), true bools, as verify materialises them."""
    if t.is_floating_point():
        out = torch.randn(t.shape, generator=generator, dtype=torch.float32) * 0.02
        return out if t.dtype == torch.float64 else out.to(t.dtype)
    if t.dtype == torch.bool:
        return torch.ones(t.shape, dtype=torch.bool)
    return torch.zeros(t.shape, dtype=t.dtype)


def _describe(failure: Any) -> str:
    """One line for a draft-export failure: where the forward decided what, on data values.

    ``forward line 103: `if boxes.numel() == 0:`: Eq(4*u1, 0) decided False``.
    """
    data = getattr(failure, "data", None) or {}
    what = str(data.get("expr") or getattr(failure.failure_type, "name", "data-dependent"))
    if data.get("result") is not None:
        what += f" decided {data['result']}"
    stack = data.get("user_stack") or []
    frame = stack[-1] if stack and isinstance(stack[-1], dict) else None
    if frame is None:
        return what
    return (
        f"{frame.get('name', '?')} line {frame.get('line', '?')}: `{frame.get('loc', '')}`: {what}"
    )


def _draft_export(
    model: ModelInputs,
) -> tuple[Traced, list[str], dict[str, int]]:
    """Trace along the path seeded random values take (see :data:`DRAFT_EXPORT`); also the value
    each data-dependent size took there, by symbol name (``{"u1": 1000}``)."""
    generator = torch.Generator().manual_seed(0)

    def make_param(t: torch.Tensor) -> torch.Tensor:
        real = _real_like(t, generator)
        if real.is_floating_point() and not isinstance(t, nn.Parameter):
            # Buffers hold statistics such as a batch norm's running variance: a negative one
            # makes the whole forward NaN, and every branch on data then takes its empty side.
            real = real.abs()
        return real.float() if real.is_floating_point() else real  # fp32: a neutral trace

    args, kwargs = pytree.tree_map_only(
        torch.Tensor,
        lambda t: t if t.device.type == "cpu" else _real_like(t, generator),
        (model.args, model.kwargs),
    )
    from torch.fx.experimental import _config as fx_config

    values: dict[str, int] = {}
    with (
        _recording_unbacked_values(values),
        swapped_tensors(model.module, make_param),
        warnings.catch_warnings(),
        quiet_logging(),
        _no_stack_traces(),
        _lift_scalar_constants(),
        # Real-value propagation fixes a boolean-mask index's size to its real value, so the
        # unbacked size it made is not in the output: expected here, not a tracing bug.
        fx_config.patch(soft_pending_unbacked_not_found_error=True),
    ):
        warnings.simplefilter("ignore")
        program = torch.export.draft_export(model.module, tuple(args), kwargs, strict=False)
    report = getattr(program, "_report", None)
    failures = list(getattr(report, "failures", []) or [])
    traced = Traced(program.graph_module, program.graph_signature, program.call_spec.out_spec)
    return traced, list(dict.fromkeys(_describe(f) for f in failures)), values


@contextlib.contextmanager
def _recording_unbacked_values(values: dict[str, int]) -> Iterator[None]:
    """Note in ``values`` the real value of each data-dependent size as a tracer learns it
    (some are then replaced by constants, so the finished program no longer lists them)."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    original = ShapeEnv.set_real_tensor_prop_unbacked_vals

    def record(self: ShapeEnv, k: Any, v: Any) -> None:
        original(self, k, v)
        if getattr(v, "is_integer", False) or isinstance(v, int):
            values.setdefault(str(k), int(v))

    ShapeEnv.set_real_tensor_prop_unbacked_vals = record  # type: ignore[method-assign]
    try:
        yield
    finally:
        ShapeEnv.set_real_tensor_prop_unbacked_vals = original  # type: ignore[method-assign]


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


def capture(
    model: ModelInputs, setting: Setting, *, training: bool = False, engine: str | None = None
) -> Capture:
    """Trace ``model`` in ``setting`` and return the graph with what replaying it needs.

    ``training`` traces it in training mode (``model.train()``), as a training step runs it;
    otherwise in the mode it is in (the bundled models are in ``eval()`` mode). ``engine`` (default:
    the model's own, ``make-fx`` unless :func:`ampgraph.pipeline.stages.trace` said otherwise) is
    ``make-fx`` or ``export``: the same graph, traced by ``make_fx`` with export's passes or by
    ``torch.export.export`` itself (``--tracer export``). A graph an FX tracer made is always
    lowered by export.
    """
    engine = engine or model.engine
    if engine not in ENGINES:
        raise CaptureError(f"unknown capture engine {engine!r}: use one of {', '.join(ENGINES)}")
    if engine == MAKE_FX and not make_fx_available():
        engine = EXPORT
    param_dtype = torch_dtype(setting.param_dtype)
    tracer, dtype_branches = _traced_by(model)
    if tracer != EXPORT:
        engine = EXPORT
    method = engine
    trace_in_setting = ENGINES[engine]
    data_dependent: list[str] = []
    unbacked: dict[str, int] = {}
    raised: dict[str, Any] | None = None
    recorder = ModuleIORecorder(model.module)
    mode = training_mode(model.module, True) if training else contextlib.nullcontext()
    reads: TraceReads | None = TraceReads()
    try:
        with recorder, mode:
            if can_trace_fake(setting.device_type):
                try:
                    program = trace_in_setting(
                        model, setting.device_type, param_dtype, setting, reads
                    )
                except Exception as exc:  # noqa: BLE001 - maybe the model's own dtype error
                    on_data = _branches_on_data(exc)
                    if not on_data:
                        raised = recorder.raised(exc)
                        try:
                            program = _retrace_neutral(model, setting, recorder, exc, reads, engine)
                            method = EXPORT_RETYPED
                        except Exception as again:  # the same rule again
                            # The half setting of a detector: its first layer raises, and the
                            # neutral trace then stops where the forward branches on data.
                            if again is exc or not _branches_on_data(again):
                                raise
                            on_data = True
                    if on_data:
                        recorder.reset()
                        program, data_dependent, unbacked = _draft_export(model)
                        method = DRAFT_EXPORT
                        reads = None  # traced on data values: this graph serves its setting only
                        draft = (program, dict(recorder.calls), list(recorder.order))
                        recorder.reset()
                        try:
                            with unbacked_values(unbacked):
                                program = _export(model, setting.device_type, param_dtype, setting)
                            method = EXPORT_DATA_PATH
                        except Exception:  # noqa: BLE001 - it raises in its setting: the draft
                            program, calls, order = draft
                            recorder.calls.clear()
                            recorder.calls.update(calls)
                            recorder.order[:] = order
            else:
                method = EXPORT_META_REPLAY
                reads = None  # traced without autocast: the same graph for the whole group
                # Traced on meta, but a torch.autocast("cuda") region in the model still means
                # what it does on a GPU: do not let it disable itself for want of one.
                with simulated_cuda_amp(setting.device_type):
                    program = _export(model, "meta", param_dtype, None)
    except CaptureError:
        raise
    except Exception as exc:  # export raises many types; all mean "this model did not trace"
        by = "make_fx" if engine == MAKE_FX and method != EXPORT_META_REPLAY else "torch.export"
        raise CaptureError(
            f"{by} could not trace {model.name!r}: {_first_line(exc)} "
            "(make the forward traceable, or pass example inputs it accepts)"
        ) from exc
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
    if method in (EXPORT_RETYPED, DRAFT_EXPORT):
        _retype_parameters(gm, kinds, param_dtype)
    if method not in DATA_PATH_METHODS:
        unbacked = {}
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
        data_dependent=data_dependent,
        unbacked_values=unbacked,
        output_paths=output_paths(program.out_spec),
        training=training,
        tied=tied_parameters(model.module),
        reads=reads.resolved(gm) if reads is not None else None,
        raised_in_setting=raised if method == EXPORT_RETYPED else None,
    )


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


def output_paths(spec: pytree.TreeSpec | None) -> list[str]:
    """Each flat output's place in the model's return value (``spec``, the tree of its
    outputs), keys and indices joined by dots.

    >>> class Two(nn.Module):
    ...     def forward(self, x):
    ...         return {"out": x + 1, "aux": (x * 2, x - 1)}
    >>> output_paths(torch.export.export(Two(), (torch.ones(2),)).call_spec.out_spec)
    ['out', 'aux.0', 'aux.1']
    """
    if spec is None:
        return []
    structure = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    try:
        flat = pytree.tree_flatten_with_path(structure)[0]
    except ValueError:
        # A type registered without key paths (transformers < 4.50's ModelOutput): read the
        # keys from the spec itself, where such types keep them as their context.
        return _spec_paths(spec, [])
    paths = []
    for path, _leaf in flat:
        parts = []
        for key in path:
            part = getattr(key, "key", getattr(key, "idx", getattr(key, "name", key)))
            parts.append(str(part))
        paths.append(".".join(parts))
    return paths


def _spec_paths(spec: pytree.TreeSpec, prefix: list[str]) -> list[str]:
    """The leaves' paths of ``spec``: a context that lists one key per child names them (a dict,
    a ModelOutput), a namedtuple its fields; anything else is numbered."""
    if spec.is_leaf():
        return [".".join(prefix)]
    # torch 2.14 deprecates the attribute for a method; 2.13 has only the attribute.
    children = spec.children() if callable(getattr(spec, "children", None)) else spec.children_specs
    context = spec.context
    keys: list[Any] = list(range(len(children)))
    if isinstance(context, (list, tuple)) and len(context) == len(children):
        keys = list(context)
    elif isinstance(context, type) and len(getattr(context, "_fields", ())) == len(children):
        keys = list(context._fields)
    return [
        p for key, child in zip(keys, children) for p in _spec_paths(child, [*prefix, str(key)])
    ]
