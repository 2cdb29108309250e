"""The tracing engines: make-fx, export and draft-export, each turning a model into a graph.

:func:`ampgraph.capture.trace.capture` chooses among them and falls back from one to another;
each engine here traces once, under the setting's fake tensors and autocast state
(:func:`_tracing_context`), and returns a :class:`Traced`: the graph, its inputs' kinds and its
outputs' tree.

>>> from ampgraph.model.build import ModelInputs
>>> x = torch.randn(2, 4, dtype=torch.bfloat16)
>>> traced = ENGINES[MAKE_FX](ModelInputs("linear", torch.nn.Linear(4, 4), (x,)), "cpu",
...                          torch.bfloat16, None)
>>> [(n.name, str(n.meta["val"].dtype)) for n in traced.graph_module.graph.nodes if n.meta]
[('p_weight', 'torch.bfloat16'), ('p_bias', 'torch.bfloat16'), ('input', 'torch.bfloat16'), ('linear', 'torch.bfloat16')]
"""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx._lazy_graph_module import _use_lazy_graph_module
from torch.utils import _pytree as pytree

from ampgraph.capture.environment import current
from ampgraph.capture.casts import cast_outputs
from ampgraph.capture.data_reads import DataReads
from ampgraph.capture.disabled import marking_disabled_regions
from ampgraph.capture.known_values import (
    INPUT_LIMIT,
    KnownValues,
    following_inputs,
    real_run_answers,
    remembering,
)
from ampgraph.capture.raises import model_call
from ampgraph.capture.reads import TraceReads
from ampgraph.compat import (
    fill_placeholder_values,
    fx_stack_traces,
)
from ampgraph.model.build import ModelInputs
from ampgraph.settings import Setting
from ampgraph.torchutil import (
    autocast_state,
    quiet_logging,
    simulated_cuda_amp,
    swapped_tensors,
    torch_dtype,
)

EXPORT = "export"
#: The default: the graph ``torch.export`` makes, traced by ``make_fx`` with export's own passes
#: and without the rest of export (see :func:`_make_fx`), in about half the time.
MAKE_FX = "make-fx"


@contextlib.contextmanager
def _no_stack_traces() -> Iterator[None]:
    """Skip recording a Python stack trace per node unless the analysis's environment asks for
    them (:class:`~ampgraph.capture.environment.AnalysisEnvironment`): only audit's source lines
    read them, and symbolising them is a sixth of the trace time."""
    with fx_stack_traces(current().stack_traces):  # a switch from torch 2.13 on (ampgraph.compat)
        yield


@contextlib.contextmanager
def _lift_scalar_constants() -> Iterator[None]:
    """Trace every tensor the forward makes from data (``torch.tensor(...)``) as a fake tensor:
    a lifted constant plus a copy op, never a constant computed for real.

    By default ``make_fx`` keeps tensors of at most one element that the forward built from data
    as real "constants" beside their fake values, and computes every op on them for real, on
    their device: with fake CUDA tensors and no GPU that needs a CUDA driver (transformers 4.x's
    eager attention does ``torch.tensor(torch.finfo(dtype).min, device=...)``; its cache setup
    ``torch.tensor([], device=...)``, an empty one, which a limit of 0 still keeps). A limit
    below 0 keeps none. Lifting them leaves the graphs of models without such tensors unchanged.
    """
    from torch.fx.experimental import proxy_tensor

    previous = proxy_tensor.CONSTANT_NUMEL_LIMIT
    proxy_tensor.CONSTANT_NUMEL_LIMIT = -1
    try:
        yield
    finally:
        proxy_tensor.CONSTANT_NUMEL_LIMIT = previous


def _fake_like(fake_mode: FakeTensorMode, device: str, dtype_for: Any) -> Any:
    def make(t: torch.Tensor) -> torch.Tensor:
        with fake_mode:
            return torch.empty(t.shape, dtype=dtype_for(t), device=device)

    return make


def plain_outputs(value: Any) -> Any:
    """``value`` with every object pytree does not know that holds tensors (a Hugging Face
    ``EncoderDecoderCache`` in a ``use_cache=True`` output) made a dict of its attributes that
    hold tensors, so that the graph can return them: each is an output of the graph, under a
    path such as ``past_key_values.self_attention_cache.layers.0.keys``. An object holding no
    tensor that fx can hold as a constant (an enum) stays as it is; one it cannot (transformers'
    ``DummyLayer``, the cache entry of a hybrid model's attention-free layer, which a real run
    returns) becomes a string saying what it was (:func:`no_tensor`): it has no dtype to analyse,
    and the output node says where it was instead of the trace failing at its end.

    >>> class Cache:
    ...     def __init__(self):
    ...         self.keys, self.size = torch.zeros(1), 3
    >>> class DummyLayer:
    ...     def __init__(self):
    ...         self.keys = None
    >>> out = plain_outputs({"logits": torch.ones(1), "cache": [Cache(), DummyLayer()]})
    >>> sorted(out["cache"][0]), out["cache"][1]
    (['keys'], 'DummyLayer: no tensor (a real run returns the object; nothing to analyse)')
    """
    return _plain(value, set())


def _plain(value: Any, seen: set[int]) -> Any:
    def leaf(item: Any) -> Any:
        if isinstance(item, (torch.Tensor, nn.Module, type)) or not hasattr(item, "__dict__"):
            return item
        if id(item) in seen:  # a cycle: the object is already being flattened
            return None
        seen.add(id(item))
        held = {k: _plain(v, seen) for k, v in vars(item).items()}
        seen.discard(id(item))
        kept = {
            k: v
            for k, v in held.items()
            if any(isinstance(t, torch.Tensor) for t in pytree.tree_leaves(v))
        }
        return kept or (item if _fx_constant(item) else no_tensor(item))

    return pytree.tree_map(leaf, value)


def no_tensor(item: Any) -> str:
    """What a graph's output says in place of ``item``, an object holding no tensor that fx
    cannot hold (a returned cache's ``DummyLayer``).

    >>> no_tensor(object())
    'object: no tensor (a real run returns the object; nothing to analyse)'
    """
    return f"{type(item).__name__}: no tensor (a real run returns the object; nothing to analyse)"


def _fx_constant(item: Any) -> bool:
    """Whether fx can hold ``item`` as a constant of a node's arguments (an enum, a dtype)."""
    tracer = fx.Tracer()
    tracer.graph = fx.Graph()
    try:
        tracer.create_arg(item)
    except NotImplementedError:  # "argument of type: <class ...>"
        return False
    return True


@dataclass
class Traced:
    """What a tracing engine gives the capture: the graph, its inputs' kinds and outputs' tree."""

    graph_module: fx.GraphModule
    signature: Any  # torch.export.ExportGraphSignature
    out_spec: pytree.TreeSpec | None
    #: The value of each data-dependent size computed from followed values (``u0``: a
    #: ``repeat_interleave`` by an input grid's counts), for the replays of the graph.
    unbacked: dict[str, int | float] = field(default_factory=dict)


def _fake_inputs(
    model: ModelInputs,
    fake_mode: FakeTensorMode,
    device: str,
    param_dtype: torch.dtype | None,
    setting: Setting | None = None,
    values: KnownValues | None = None,
) -> Any:
    """Fake parameters, buffers and example inputs in ``setting``'s dtypes: floating parameters
    in ``param_dtype`` (what ``Module.to(dtype)`` converts), floating buffers in the setting's
    buffer dtype (a recipe that casts parameters only keeps them), floating inputs in its input
    dtype where the recipe casts them before the forward (FSDP2's ``cast_forward_inputs``).
    ``values`` gains the real values of the integer and bool inputs the capture follows
    (:mod:`ampgraph.capture.known_values`)."""
    buffer_dtype = param_dtype
    input_dtype = None
    if setting is not None and param_dtype is not None:
        buffer_dtype = torch_dtype(setting.buffers)
        input_dtype = None if setting.input_dtype is None else torch_dtype(setting.input_dtype)

    def param_dtype_for(t: torch.Tensor) -> torch.dtype:
        dtype = param_dtype if isinstance(t, nn.Parameter) else buffer_dtype
        return dtype if (dtype is not None and t.is_floating_point()) else t.dtype

    make_param = _fake_like(fake_mode, device, param_dtype_for)
    make_input = _fake_like(
        fake_mode,
        device,
        lambda t: input_dtype if (input_dtype is not None and t.is_floating_point()) else t.dtype,
    )
    if values is not None:  # a real run decides from these values (an all-ones mask)
        make_input = remembering(make_input, values.known, INPUT_LIMIT)
    args, kwargs = pytree.tree_map_only(torch.Tensor, make_input, (model.args, model.kwargs))
    return make_param, tuple(args), kwargs


@contextlib.contextmanager
def _tracing_context(
    model: ModelInputs,
    device: str,
    setting: Setting | None,
    reads: TraceReads | None,
    make_param: Any,
    values: KnownValues,
) -> Iterator[None]:
    """Everything both engines trace under: the setting's fake tensors and autocast state;
    ``values``: the followed inputs' values (:func:`_fake_inputs`), and the buffers' once
    they are swapped."""
    autocast = (
        autocast_state(device, True, torch_dtype(setting.amp_dtype))
        if setting is not None and setting.autocast
        else contextlib.nullcontext()
    )
    with (
        swapped_tensors(model.module, remembering(make_param, values.known)),
        # Python's reads of data no op records (a 0-d tensor formatted, an index made of 0-d
        # tensors), made as a real run makes them; beneath ``values``, which answers the reads
        # of values it knows first.
        DataReads(),
        # Sizes the model keeps in integer buffers, and what a real run decides from its
        # integer inputs' values (an all-ones mask dropped), as a real run has them.
        values,
        real_run_answers(values),
        autocast,
        simulated_cuda_amp(setting.device_type if setting is not None else device),
        warnings.catch_warnings(),
        quiet_logging(),
        _no_stack_traces(),
        _lift_scalar_constants(),
        reads if reads is not None else contextlib.nullcontext(),
        reads.autocast_queries() if reads is not None else contextlib.nullcontext(),
        cast_outputs(model.module, setting),
        _inner_compiles_run_eager(),
        marking_disabled_regions(),
    ):
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def _inner_compiles_run_eager() -> Iterator[None]:
    """Trace through the ``torch.compile`` calls a model makes itself (a compiled submodule,
    ``flex_attention``'s own compile of its higher-order op) as the eager ops they compile:
    Dynamo, switched off, runs each compiled function as plain Python, which the tracer records
    (a ``torch.compiler.disable`` region runs so anyway). Left on, Dynamo would try to compile
    inside ``make_fx``'s trace and fail. ``flex_attention`` compiles with ``fullgraph=True``,
    which refuses to run uncompiled: its own switch (``_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG``)
    calls the higher-order op directly instead, which the tracer records as one node. The switch
    is set where the model has imported flex_attention, and as it is imported where the model
    imports it while it runs (inside its forward): importing it here for every model would
    change what every capture runs beside, for the few that call it."""
    from torch._dynamo import config as dynamo_config

    with contextlib.ExitStack() as stack:
        stack.enter_context(dynamo_config.patch(disable=True))
        if hasattr(dynamo_config, "error_on_nested_fx_trace"):
            # With is_compiling() false while the model runs (as in eager, raises.as_eager_runs),
            # a compiled function called under the tracer would refuse to be traced: inline it.
            stack.enter_context(dynamo_config.patch(error_on_nested_fx_trace=False))
        stack.enter_context(_flex_compile_off())
        yield


_FLEX = "torch.nn.attention.flex_attention"
_FLEX_SWITCH = "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG"


@contextlib.contextmanager
def _flex_compile_off() -> Iterator[None]:
    """``flex_attention``'s switch on while the model runs (:func:`_inner_compiles_run_eager`):
    set on the module where it is imported, else by a finder first on ``sys.meta_path`` as the
    module is first executed, and off again after, as an imported one's is."""
    flex = sys.modules.get(_FLEX)
    if flex is not None:
        with mock.patch.object(flex, _FLEX_SWITCH, True):
            yield
        return
    finder = _SwitchOnImport()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        flex = sys.modules.get(_FLEX)
        if flex is not None:  # imported while the model ran: as after an ordinary import
            setattr(flex, _FLEX_SWITCH, False)


class _SwitchOnImport:
    """A meta-path finder that finds flex's module as the finders after it do, and sets its
    switch once the module's code has run (the module reads it when ``flex_attention`` is
    called, not when it is imported)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _FLEX:
            return None
        import importlib.machinery as machinery

        later = sys.meta_path[sys.meta_path.index(self) + 1:] if self in sys.meta_path else []
        for finder in later:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                break
        else:
            return None
        # A file loader is made for the one spec it loads: wrapping it touches no other module.
        files = (machinery.SourceFileLoader, machinery.SourcelessFileLoader)
        if not isinstance(spec.loader, files):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            setattr(module, _FLEX_SWITCH, True)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # its own loader
        return spec


def _export(
    model: ModelInputs,
    device: str,
    param_dtype: torch.dtype | None,
    setting: Setting | None,
    reads: TraceReads | None = None,
) -> Traced:
    """``torch.export.export`` in the setting (the ``export`` tracer)."""
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    values = KnownValues({})
    make_param, args, kwargs = _fake_inputs(model, fake_mode, device, param_dtype, setting, values)
    tracing = _tracing_context(model, device, setting, reads, make_param, values)
    # export makes fake inputs of its own: the followed ones are noted again as they arrive.
    with tracing, _plain_forward(model.module, following_inputs(model.args, model.kwargs, values)):
        program = torch.export.export(model.module, args, kwargs, strict=False)
    return Traced(
        program.graph_module, program.graph_signature, program.call_spec.out_spec, values.sizes
    )


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
    from torch._export.passes.lift_constants_pass import ConstantAttrMap, lift_constants_pass
    from torch._export.passes.replace_autocast_with_hop_pass import replace_autocast_with_hop_pass
    from torch._export.passes.replace_set_grad_with_hop_pass import replace_set_grad_with_hop_pass
    from torch._export.utils import placeholder_naming_pass
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    # A shape environment, as export has, so that ops with data-dependent output sizes
    # (nonzero, a boolean-mask index) trace with unbacked sizes instead of failing.
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
    values = KnownValues({})
    make_param, args, kwargs = _fake_inputs(model, fake_mode, device, param_dtype, setting, values)
    module = model.module
    with _tracing_context(model, device, setting, reads, make_param, values):
        params = dict(module.named_parameters(remove_duplicate=False))
        buffers = dict(module.named_buffers(remove_duplicate=False))
        names = [*params, *buffers]
        # A tied parameter is one tensor under two names, so every use reads the last alias's
        # placeholder (OPT's embedding reads ``p_lm_head_weight``), as in export's graph.
        state = [*params.values(), *buffers.values()]
        gm, flat_in, out_spec = _trace_functional(module, names, state, (args, kwargs), fake_mode)

    _runtime_asserts(gm, fake_mode)
    fill_placeholder_values(gm.graph, [*state, *flat_in])  # torch 2.10, 2.11 leave some out
    signature = _export_signature(gm, names, len(params), flat_in)
    constants = lift_constants_pass(gm, signature, ConstantAttrMap())
    # The region passes split the graph and inline it back, recompiling its Python code each
    # time (a tenth of a second per recompile for a 70B-shaped graph); nothing here runs that
    # code, so each module compiles only if something calls it.
    with _use_lazy_graph_module(True):
        gm, signature = replace_set_grad_with_hop_pass(gm, signature)
        gm, signature = replace_autocast_with_hop_pass(gm, signature)
    _export_module_stacks(gm)
    with fake_mode:
        placeholder_naming_pass(
            gm, signature, module, args, kwargs, dict(zip(names, state)), constants
        )
    return Traced(gm, signature, out_spec, values.sizes)


def _trace_functional(
    module: nn.Module,
    names: list[str],
    state: list[torch.Tensor],
    inputs: tuple[tuple[Any, ...], dict[str, Any]],
    fake_mode: FakeTensorMode,
) -> tuple[fx.GraphModule, list[Any], pytree.TreeSpec | None]:
    """Pre-dispatch ``make_fx`` of ``module`` with ``state`` (its parameters and buffers, by
    ``names``) as inputs, as non-strict export traces it: the graph, flat inputs, outputs' tree."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._export.utils import _compiling_state_context
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.nn.utils.stateless import _reparametrize_module

    flat_inputs, in_spec = pytree.tree_flatten(inputs)
    out_specs: list[pytree.TreeSpec] = []

    def forward(*flat: Any) -> tuple[Any, ...]:
        call_args, call_kwargs = pytree.tree_unflatten(list(flat[len(names) :]), in_spec)
        tensors = dict(zip(names, flat[: len(names)]))
        with _reparametrize_module(module, tensors, tie_weights=False, strict=False):
            out = model_call(module, *call_args, **call_kwargs)
        leaves, spec = pytree.tree_flatten(plain_outputs(out))
        out_specs.append(spec)
        return tuple(leaves)

    forward._orig_mod = module  # type: ignore[attr-defined] # make_fx's module-stack root
    # Model code that asks torch.compiler.is_exporting() (transformers' mask builders)
    # takes export's path, as under export.
    with (
        fake_mode,
        enable_python_dispatcher(),
        _compiling_state_context(),
        _use_lazy_graph_module(True),  # see _make_fx: nothing runs its code
    ):
        gm = make_fx(forward, record_module_stack=True, pre_dispatch=True)(*state, *flat_inputs)
    return gm, flat_inputs, out_specs[-1] if out_specs else None


def _export_signature(
    gm: fx.GraphModule, names: list[str], n_params: int, flat_inputs: list[Any]
) -> Any:
    """The ``ExportGraphSignature`` export gives the graph: its placeholders are the
    ``n_params`` parameters, then the buffers (``names``), then the user's inputs."""
    from torch.export import graph_signature as sig

    inputs = []
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        if i < len(names):  # a parameter (not persistent: None) or a buffer (persistent)
            kind = sig.InputKind.PARAMETER if i < n_params else sig.InputKind.BUFFER
            persistent = None if i < n_params else True
            inputs.append(sig.InputSpec(kind, sig.TensorArgument(node.name), names[i], persistent))
            continue
        value = flat_inputs[i - len(names)]
        tensor = isinstance(value, torch.Tensor)
        arg = sig.TensorArgument(node.name) if tensor else sig.ConstantArgument(node.name, value)
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
    return sig.ExportGraphSignature(inputs, outputs)


def _export_module_stacks(gm: fx.GraphModule) -> None:
    """Every node's module stack keyed as export keys it, its placeholders' and outputs' gone."""
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


@contextlib.contextmanager
def _plain_forward(module: nn.Module, note: Any = None) -> Iterator[None]:
    """``module``'s forward returning :func:`plain_outputs`: export cannot return a cache object
    (BART's ``EncoderDecoderCache`` with ``use_cache=True``), as make-fx's flattening cannot.
    The forward is swapped on the instance, so every module path stays as it is. ``note`` is
    called with the inputs first (:func:`~ampgraph.capture.known_values.following_inputs`)."""
    forward = module.forward
    had = "forward" in vars(module)  # another swap's, or the model's own

    @functools.wraps(forward)  # export names the graph's inputs from the forward's signature
    def plain(*args: Any, **kwargs: Any) -> Any:
        if note is not None:
            note(args, kwargs)
        return plain_outputs(model_call(forward, *args, **kwargs))

    module.forward = plain  # type: ignore[method-assign]
    try:
        yield
    finally:
        if had:
            module.forward = forward  # type: ignore[method-assign]
        else:  # the class's forward again
            vars(module).pop("forward", None)


__all__ = [
    "ENGINES",
    "EXPORT",
    "MAKE_FX",
    "Traced",
    "make_fx_available",
]
