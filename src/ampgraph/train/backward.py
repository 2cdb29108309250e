"""Backward: the dtype flow of a training step, differentiated on fake tensors.

The forward is replayed as ampgraph annotates it (:class:`~ampgraph.annotate.annotator.AutocastAnnotator`,
autocast off, every cast autocast makes written out as an explicit ``aten._to_copy``), a scalar
loss is taken from one of its outputs, and ``torch.autograd.grad`` differentiates it, all inside
``make_fx``. The result is the *joint graph*: the forward as autograd recorded it, the loss, and
every op of the backward, each with the dtype autograd's own formulas give it. PyTorch's autograd
engine does the differentiating, on meta tensors for CUDA settings (autograd on fake CUDA tensors
needs a GPU; DESIGN.md fact 11) and on fake CPU tensors for CPU ones, so what it saves, where it
casts gradients back (``ToCopyBackward``, the engine casting each gradient to its input's dtype)
and which backward matmuls run in 16 bits are autograd's answers, not rules written here.

The loss is ``output.float().sum()`` and ``loss.backward()`` runs as in a training step (each
gradient accumulated into ``.grad``). The loss's choice: whatever the loss, the gradient that reaches the model has
the dtype of the output it came from (the engine casts it so), so the loss changes nothing in the
model's backward. By default backward runs outside the autocast context, as PyTorch's AMP recipe
calls ``scaler.scale(loss).backward()``; with ``backward_autocast=True`` it runs inside, and
autocast's policies apply to the backward's ops too (from ampgraph's tables, as in the forward).

Each joint-graph node knows the forward node it belongs to: forward nodes by the annotator node
that ran when autograd recorded them, backward nodes by the autograd node being run (its
sequence number, which autograd gave it in the forward). Every tensor autograd saves is seen by a
``saved_tensors_hooks`` pack hook while the forward runs.

>>> from ampgraph import analyze
>>> import torch
>>> mlp = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
>>> r = analyze(mlp, "autocast=on,device=cpu", args=(torch.randn(2, 4),), pass_="train")
>>> [(g.parameter, g.param_dtype, g.dtype) for g in r.backward.gradients][:2]
[('0.weight', 'float32', 'float32'), ('0.bias', 'float32', 'float32')]
>>> [(t.module, t.kind, t.dtype, t.bytes) for t in r.backward.saved]
[('0', 'activation', 'bfloat16', 16), ('1', 'activation', 'bfloat16', 16), ('1', 'parameter copy', 'bfloat16', 32)]
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import inspect
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx._lazy_graph_module import _use_lazy_graph_module
from torch.fx.experimental import proxy_tensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ampgraph.annotate.annotator import AutocastAnnotator, InnerAutocast
from ampgraph.capture.trace import Capture
from ampgraph.errors import AmpgraphError
from ampgraph.annotate.kernel_dtypes import RealCpuDtypes, retyped
from ampgraph.policy import rules
from ampgraph.report.records import Backward, Cast, Gradient, NodeRecord, SavedTensor
from ampgraph.annotate.replay import (
    WRAP_WITH_SET_GRAD_ENABLED,
    Failed,
    StrictDtypeMode,
    dtype_names,
    op_name,
    placeholder_value,
    tensor_leaves,
)
from ampgraph.settings import Setting, short_dtype
from ampgraph.torchutil import autocast_state, dtype_name

LOSS_EXPRESSION = "output.float().sum()"
#: node.meta key on the joint graph's ``_to_copy`` nodes that are autocast's casts.
AUTOCAST_CAST = "ampgraph_autocast_cast"
#: node.meta key: (phase, forward node) of every joint-graph node.
OWNER = "ampgraph_owner"
METHOD = "make_fx over the annotated forward + loss + torch.autograd.grad"
FORWARD, LOSS, BACKWARD, INPUT = "forward", "loss", "backward", "input"


class LossError(AmpgraphError):
    """The loss cannot be taken from the model's output (no floating tensor, unknown --loss)."""


def trace_device(setting: Setting) -> str:
    """Where the joint graph is traced: fake CPU tensors for CPU, the meta device for CUDA.

    >>> trace_device(Setting.parse("amp-fp32"))
    'meta'
    """
    return "cpu" if setting.device_type == "cpu" else "meta"


# -- choosing the output the loss reduces --------------------------------------------------------
def loss_output(cap: Capture, loss: str | int | None, values: list[Any] | None = None) -> int:
    """Index (among the capture's user outputs) of the output the loss reduces.

    ``loss`` is an output's path (``logits``, ``0``, ``aux.1``; see ``Capture.output_paths``), an
    integer index into the model's outputs, or None: the first floating-point output.
    ``values`` are the outputs' values where known, to find floating ones.
    """
    paths = cap.output_paths or [str(i) for i in range(len(values or []))]
    choices = ", ".join(paths) or "none"

    def floating(i: int) -> bool:
        if values is None:
            val = _user_output_nodes(cap)[i].meta.get("val")
        else:
            val = values[i]
        return isinstance(val, torch.Tensor) and val.is_floating_point()

    if loss is None or loss == "":
        for i in range(len(paths)):
            if floating(i):
                return i
        raise LossError(
            f"the output of {cap.model_name!r} holds no floating-point tensor to reduce to a "
            f"loss (outputs: {choices}): give --loss KEY|INDEX naming one"
        )
    text = str(loss)
    index = paths.index(text) if text in paths else None
    if index is None and text.lstrip("-").isdigit():
        top = list(dict.fromkeys(p.split(".")[0] for p in paths))
        i = int(text)
        if -len(top) <= i < len(top):
            name = top[i]
            index = paths.index(name) if name in paths else None
    if index is None:
        raise LossError(
            f"--loss {text!r} names no single tensor output of {cap.model_name!r}: give one of "
            f"{choices} (or its index)"
        )
    if not floating(index):
        raise LossError(
            f"--loss {text!r} is not a floating-point tensor: give a floating output of "
            f"{cap.model_name!r} ({choices})"
        )
    return index


def _user_output_nodes(cap: Capture) -> list[Any]:
    output = next(n for n in cap.graph_module.graph.nodes if n.op == "output")
    flat = list(pytree.tree_leaves(output.args[0]))
    # torch.export returns mutated buffers first, then the user's outputs.
    return flat[len(flat) - len(cap.output_paths) :] if cap.output_paths else flat


# -- the state of one joint trace ------------------------------------------------------------------
class _Segments:
    """Ranges of a growing sequence (graph nodes, autograd sequence numbers), each with an owner."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.owners: list[Any] = []

    def mark(self, start: int, owner: Any) -> None:
        if self.starts and self.starts[-1] == start:
            self.owners[-1] = owner
            return
        self.starts.append(start)
        self.owners.append(owner)

    def owner(self, index: int, default: Any = None) -> Any:
        i = bisect.bisect_right(self.starts, index) - 1
        return self.owners[i] if i >= 0 else default


@dataclass
class _Saved:
    owner: str | None
    tensor: torch.Tensor
    producer: str | None


@dataclass
class TraceState:
    """What one joint trace learns besides the graph."""

    setting: Setting
    graph: fx.Graph
    tracer: Any
    nodes: _Segments = field(default_factory=_Segments)
    seq: _Segments = field(default_factory=_Segments)
    stack: list[tuple[str, str | None]] = field(default_factory=list)
    saved: list[_Saved] = field(default_factory=list)
    #: autocast's cast cache: (id(parameter), dtype) -> the cast (a leaf fp32 tensor that
    #: requires grad is cast once per autocast context, as ``cached_cast`` does).
    cast_cache: dict[tuple[int, torch.dtype], torch.Tensor] = field(default_factory=dict)
    keep: list[torch.Tensor] = field(default_factory=list)
    forward_records: list[NodeRecord] = field(default_factory=list)
    #: storage of each graph input -> its kind (parameter, buffer, input, constant).
    input_storages: dict[int, str] = field(default_factory=dict)
    #: the dtype conversions of parameters and buffers made in the forward.
    copies: Any = None

    def enter(self, owner: tuple[str, str | None]) -> None:
        self.stack.append(owner)
        self._mark(owner)

    def exit(self) -> None:
        self.stack.pop()
        self._mark(self.stack[-1] if self.stack else (FORWARD, None))

    def _mark(self, owner: tuple[str, str | None]) -> None:
        self.nodes.mark(len(self.graph.nodes), owner)
        self.seq.mark(torch.autograd._get_sequence_nr(), owner)

    def node_of(self, t: torch.Tensor) -> fx.Node | None:
        """The joint-graph node that produced ``t``."""
        slot = proxy_tensor.get_proxy_slot(t, self.tracer, None)
        return slot.proxy.node if slot is not None else None

    def new_nodes(self, since: int) -> list[fx.Node]:
        """Nodes added to the graph since it had ``since`` nodes, in order."""
        out = []
        node = self.graph._root.prev
        for _ in range(len(self.graph.nodes) - since):
            out.append(node)
            node = node.prev
        return out[::-1]


_STATE: contextvars.ContextVar[TraceState | None] = contextvars.ContextVar(
    "ampgraph_joint_trace", default=None
)


def _state() -> TraceState:
    state = _STATE.get()
    assert state is not None, "only inside trace_joint"
    return state


# -- the forward, annotated and differentiable ----------------------------------------------------
class JointAnnotator(AutocastAnnotator):
    """The annotator, replayed so that autograd records it: on the trace device, casts as
    explicit ``_to_copy`` calls (cached for parameters as autocast caches them), grad-mode
    regions honoured, every node's joint-graph nodes and autograd nodes attributed to it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.device = torch.device(trace_device(self.setting))

    def run_node(self, n: fx.Node) -> Any:
        if n.op != "call_function":
            return super().run_node(n)
        state = _state()
        state.enter((FORWARD, self.qualified(n)))
        try:
            return super().run_node(n)
        finally:
            state.exit()

    def run_region(self, n: fx.Node, args: tuple[Any, ...]) -> Any:
        if n.target is WRAP_WITH_SET_GRAD_ENABLED:
            with torch.set_grad_enabled(bool(args[0])):  # no_grad inside a forward: no backward
                return super().run_region(n, args)
        return super().run_region(n, args)

    def trace_decomposition(self, trace: Any) -> fx.GraphModule:
        # Traced apart from the joint graph: neither recorded in it nor seen by autograd.
        with (
            proxy_tensor.disable_proxy_modes_tracing(),
            torch.no_grad(),
            torch.autograd.graph.disable_saved_tensors_hooks("ampgraph: a side trace"),
        ):
            return trace()

    def _cast_all(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        to: torch.dtype,
        device_type: str,
        n: fx.Node | None,
        unknown: str = "?",
    ) -> tuple[tuple[Any, ...], dict[str, Any], list[Cast]]:
        state = _state()
        lower = self.state.states[device_type][1]
        casts: list[Cast] = []

        def cast(t: Any) -> Any:
            if not rules.is_eligible(t, device_type) or t.dtype == to:
                return t
            casts.append(Cast(self.producer_label(n, t, unknown), dtype_name(t.dtype),
                              dtype_name(to)))  # fmt: skip
            # autocast_mode.cpp cached_cast: fp32 leaves that require grad, cast to the lower
            # precision dtype, are cast once per autocast context and the copy reused.
            cacheable = (
                to == lower and t.dtype == torch.float32 and t.requires_grad and t.is_leaf
                and not t._is_view()
            )  # fmt: skip
            key = (id(t), to)
            if cacheable and key in state.cast_cache:
                return state.cast_cache[key]
            out = _explicit_cast(state, t, to)
            if cacheable:
                state.cast_cache[key] = out
            return out

        # autocast's wrappers cast their arguments in a C++ pack expansion, which GCC (torch's
        # Linux wheels) evaluates right to left: the casts' autograd nodes get their sequence
        # numbers in that order, and the backward runs them by it.
        leaves, spec = pytree.tree_flatten((args, kwargs))
        cast_leaves = [cast(leaf) if isinstance(leaf, torch.Tensor) else leaf
                       for leaf in reversed(leaves)][::-1]  # fmt: skip
        casts.reverse()
        new_args, new_kwargs = pytree.tree_unflatten(cast_leaves, spec)
        return tuple(new_args), dict(new_kwargs), casts


def _explicit_cast(state: TraceState, t: torch.Tensor, to: torch.dtype) -> torch.Tensor:
    out = torch.ops.aten._to_copy.default(t, dtype=to)
    node = state.node_of(out)
    if node is not None:
        node.meta[AUTOCAST_CAST] = True
    return out


class ParameterCopies(TorchDispatchMode):
    """Note the storage of every dtype conversion of a parameter or buffer (autocast's 16-bit
    copies of weights, a model's own ``weight.to(dtype)``): memory that exists only while it is
    needed, unlike the parameter's. The copies are kept alive so no other tensor reuses their
    storage while the step runs. :mod:`ampgraph.train.verify` watches the real step with it too.
    """

    def __init__(self, sources: set[int]) -> None:
        super().__init__()
        self.sources = sources
        self.storages: set[int] = set()
        self.keep: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if (
            func is torch.ops.aten._to_copy.default
            and isinstance(out, torch.Tensor)
            and args[0].untyped_storage()._cdata in self.sources
        ):
            self.storages.add(out.untyped_storage()._cdata)
            self.keep.append(out)
        return out


class CpuMixedNorms(RealCpuDtypes):
    """Give the CPU's mixed-type normalisations the dtypes the real kernels return, in the
    joint graph too (:mod:`ampgraph.annotate.kernel_dtypes`): what is saved, and what the backward
    computes from it, is as on the CPU."""

    def retype(self, out: Any, dtypes: dict[int, torch.dtype]) -> tuple[Any, ...]:
        state = _state()
        # The nodes' values are snapshots, as make_fx's own: a node holding a gradient itself
        # would keep the engine from stealing it into .grad, and add a copy a real step lacks.
        with proxy_tensor.disable_proxy_modes_tracing():
            fixed = retyped(out, dtypes)
            for old, new in zip(out, fixed):
                if new is old:
                    continue
                slot = proxy_tensor.get_proxy_slot(old, state.tracer, None)
                if slot is not None:
                    proxy_tensor.set_proxy_slot(new, state.tracer, slot)
                    slot.proxy.node.meta["val"] = proxy_tensor.extract_val(new)
            node = state.node_of(out[0])
            if node is not None and node.args:
                node.args[0].meta["val"] = proxy_tensor.extract_val(fixed)
        return fixed


class BackwardAutocast(InnerAutocast):
    """Autocast on the backward's ops, for ``loss.backward()`` called inside the context.

    A dispatch mode sees each op a backward formula calls, as autocast does, and applies the
    policy tables to it; its casts are explicit ``_to_copy`` nodes, marked, and the op's node
    records its policy and casts.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if not isinstance(func, torch._ops.OpOverload):
            return func(*args, **kwargs)
        category, device_type = self.annotator._policy(func, tuple(args), kwargs)
        if category is None:
            return func(*args, **kwargs)
        state = _state()
        sources = {id(t): state.node_of(t) for t in tensor_leaves((args, kwargs))}
        before = len(state.graph.nodes)
        call_args, call_kwargs, casts, op, _why = self.annotator._apply(
            func, category, device_type, tuple(args), kwargs, None
        )
        for node in state.new_nodes(before):
            node.meta[AUTOCAST_CAST] = True
        for c, t in zip(casts, _cast_sources(args, kwargs, casts)):
            source = sources.get(id(t)) if t is not None else None
            c.node = source.name if source is not None else "?"
        start = len(state.graph.nodes)
        out = op(*call_args, **call_kwargs)
        for node in state.new_nodes(start):
            node.meta["ampgraph_policy"] = category
            node.meta["ampgraph_casts"] = casts
        return out


def _cast_sources(
    args: Any, kwargs: dict[str, Any], casts: list[Cast]
) -> list[torch.Tensor | None]:
    """The tensors ``casts`` were made of, in order (the eligible ones of another dtype)."""
    tensors = [t for t in tensor_leaves((args, kwargs)) if t.is_floating_point()]
    out: list[torch.Tensor | None] = []
    i = 0
    for c in casts:
        while i < len(tensors) and dtype_name(tensors[i].dtype) != c.from_dtype:
            i += 1
        out.append(tensors[i] if i < len(tensors) else None)
        i += 1
    return out


# -- the joint trace -------------------------------------------------------------------------------
@dataclass
class JointTrace:
    """The joint graph of a training step and what was learnt while tracing it."""

    capture: Capture
    graph_module: fx.GraphModule
    state: TraceState
    loss_index: int
    loss_path: str
    backward_autocast: bool
    #: placeholder name -> (kind, target) for the joint graph's placeholders.
    input_kinds: dict[str, tuple[str, str]]
    #: the gradient outputs, one per trainable parameter: (target, placeholder of the param).
    parameters: list[tuple[str, str]]
    #: why the forward could not be differentiated (it raised), or None.
    skipped: str | None = None


#: make_fx's switch for its torch-function metadata mode, where this torch has it.
_LEAN_MAKE_FX: dict[str, Any] = (
    {"_disable_torch_fn_metadata_mode": True}
    if "_disable_torch_fn_metadata_mode" in inspect.signature(proxy_tensor.make_fx).parameters
    else {}
)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def trace_joint(
    cap: Capture, *, loss: str | int | None = None, backward_autocast: bool = False
) -> JointTrace:
    """Trace forward + ``output.float().sum()`` + ``torch.autograd.grad`` of ``cap``."""
    setting = cap.setting
    device = trace_device(setting)
    placeholders = [p for p in cap.graph_module.graph.nodes if p.op == "placeholder"]
    kinds = [cap.input_kinds.get(p.name, ("input", p.name)) for p in placeholders]
    with FakeTensorMode(allow_non_fake_inputs=True):
        values = [placeholder_value(p, device) for p in placeholders]
    trainable = [
        i for i, (kind, _t) in enumerate(kinds)
        if kind == "parameter" and isinstance(values[i], torch.Tensor)
        and values[i].is_floating_point()
    ]  # fmt: skip
    index = loss_output(cap, loss)
    paths = cap.output_paths
    outcome: dict[str, Any] = {}

    def step(*inputs: Any) -> Any:
        inputs = list(inputs)
        mode = proxy_tensor.get_proxy_mode()
        state = TraceState(setting, mode.tracer.graph, mode.tracer)
        token = _STATE.set(state)
        try:
            return _step(state, inputs)
        finally:
            _STATE.reset(token)
            outcome["state"] = state

    def _step(state: TraceState, inputs: list[Any]) -> Any:
        storages: dict[int, tuple[str, str]] = {}
        for i, (kind, target) in enumerate(kinds):
            t = inputs[i]
            if isinstance(t, torch.Tensor):
                storages.setdefault(t.untyped_storage()._cdata, (kind, target))
        params = []
        for i in trainable:
            inputs[i] = inputs[i].requires_grad_(True)
            params.append(inputs[i])
        state.input_storages = {key: kind for key, (kind, _target) in storages.items()}

        def pack(t: torch.Tensor) -> torch.Tensor:
            owner = state.stack[-1][1] if state.stack else None
            node = state.node_of(t)
            state.saved.append(_Saved(owner, t, node.name if node is not None else None))
            return t

        # A dispatch mode costs every op a trip through Python: this one only where it acts.
        def norms() -> contextlib.AbstractContextManager[Any]:
            return CpuMixedNorms() if device == "cpu" else contextlib.nullcontext()

        annotator = JointAnnotator(cap)
        copies = ParameterCopies(
            {k for k, kind in state.input_storages.items() if kind in ("parameter", "buffer")}
        )
        state.copies = copies
        with (
            copies,
            norms(),
            StrictDtypeMode(setting.device_type),
            autocast_state("cpu", False, torch.get_autocast_dtype("cpu")),
            autocast_state("cuda", False, torch.get_autocast_dtype("cuda")),
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        ):
            out = annotator.run(*inputs)
        state.forward_records = annotator.records
        flat = list(pytree.tree_leaves(out))
        user = flat[len(flat) - len(paths) :] if paths else flat
        failed = [v for v in flat if isinstance(v, Failed)]
        chosen = user[index] if index < len(user) else None
        if failed or not isinstance(chosen, torch.Tensor) or not chosen.requires_grad:
            outcome["skipped"] = (
                f"the forward failed at {failed[0].node}: there is no backward to run"
                if failed
                else "the chosen output does not depend on any parameter"
            )
            return [None] * len(params)
        state.enter((LOSS, None))
        value = chosen.float().sum()
        _hook_backward(state, value)
        scope = (
            BackwardAutocast(annotator)
            if backward_autocast and setting.autocast
            else contextlib.nullcontext()
        )
        state.enter((BACKWARD, None))
        # The real CPU kernels' dtypes in the backward too, under autocast's casts where it runs
        # inside the context (the mode entered first sees each op after the one entered last).
        with norms(), scope:
            # loss.backward(), as a training step calls it: the engine accumulates each
            # gradient into .grad as it does for real (a copy where strides must change).
            value.backward()
        return [p.grad for p in params]

    with _quiet(), _use_lazy_graph_module(True):
        # Nothing calls the joint graph's Python code (the oracle interprets its nodes), so it is
        # compiled only if something does; the torch-function metadata make_fx records by
        # default (node.meta["torch_fn"]) is read by nothing here and costs every call a mode.
        gm = proxy_tensor.make_fx(step, tracing_mode="real", **_LEAN_MAKE_FX)(*values)
    state = outcome["state"]
    joint_placeholders = [p for p in gm.graph.nodes if p.op == "placeholder"]
    input_kinds = {jp.name: kind for jp, kind in zip(joint_placeholders, kinds)}
    _attribute(gm, state)
    return JointTrace(
        capture=cap,
        graph_module=gm,
        state=state,
        loss_index=index,
        loss_path=paths[index] if index < len(paths) else str(index),
        backward_autocast=backward_autocast and setting.autocast,
        input_kinds=input_kinds,
        parameters=[(kinds[i][1], joint_placeholders[i].name) for i in trainable],
        skipped=outcome.get("skipped"),
    )


def _hook_backward(state: TraceState, loss: torch.Tensor) -> None:
    """Attribute what each autograd node runs to the forward node that created it."""
    seen: set[Any] = set()
    todo = [loss.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        # AccumulateGrad (writing .grad) belongs to no forward node.
        is_leaf = type(fn).__name__ == "AccumulateGrad"
        owner = (BACKWARD, None) if is_leaf else state.seq.owner(fn._sequence_nr(), (LOSS, None))

        def prehook(_grads: Any, owner: tuple[str, str | None] = owner) -> None:
            state.nodes.mark(len(state.graph.nodes), (BACKWARD, owner[1]))

        fn.register_prehook(prehook)
        todo.extend(nxt for nxt, _ in fn.next_functions)


def _attribute(gm: fx.GraphModule, state: TraceState) -> None:
    """node.meta[OWNER] = (phase, forward node) for every joint-graph node."""
    for i, node in enumerate(gm.graph.nodes):
        if node.op == "placeholder":
            node.meta[OWNER] = (INPUT, None)
            continue
        node.meta[OWNER] = state.nodes.owner(i, (FORWARD, None))


# -- records ---------------------------------------------------------------------------------------
def backward_section(trace: JointTrace) -> Backward:
    """The report's ``backward`` section: loss, backward node records, gradients, saved tensors."""
    cap = trace.capture
    state = trace.state
    forward = {r.name: r for r in state.forward_records}
    loss = {"output": trace.loss_path, "expression": LOSS_EXPRESSION}
    if trace.skipped:
        return Backward(loss=loss, autocast=trace.backward_autocast, nodes=[], gradients=[],
                        saved=[], method=METHOD, skipped=trace.skipped)  # fmt: skip
    user = _user_output_nodes(cap)
    if trace.loss_index < len(user) and trace.loss_index < len(cap.output_paths):
        rec = forward.get(user[trace.loss_index].name)
        loss["dtype"] = rec.out_dtype if rec is not None else None
    records = _node_records(trace, forward)
    return Backward(
        loss=loss,
        autocast=trace.backward_autocast,
        nodes=records,
        gradients=_gradients(trace),
        saved=_saved(trace, forward),
        method=METHOD,
    )


def _val_dtypes(node: Any) -> list[str | None]:
    if not isinstance(node, fx.Node):
        return []
    return dtype_names(node.meta.get("val"))


def _node_records(trace: JointTrace, forward: dict[str, NodeRecord]) -> list[NodeRecord]:
    records: list[NodeRecord] = []
    for node in trace.graph_module.graph.nodes:
        phase, owner = node.meta.get(OWNER, (FORWARD, None))
        if node.op != "call_function" or phase not in (LOSS, BACKWARD):
            continue
        if node.meta.get(AUTOCAST_CAST):
            continue  # shown as the casts of the op it feeds, as in the forward
        fwd = forward.get(owner) if owner else None
        inputs = []
        for arg in node.all_input_nodes:
            source = arg
            while source.meta.get(AUTOCAST_CAST) and source.all_input_nodes:
                source = source.all_input_nodes[0]
            entry: dict[str, Any] = {"node": source.name, "dtype": _first(_val_dtypes(source))}
            src_phase, src_owner = source.meta.get(OWNER, (FORWARD, None))
            if src_phase == INPUT:
                entry["from"] = trace.input_kinds.get(source.name, ("input", source.name))[1]
            elif src_phase == FORWARD:
                entry["from"] = src_owner
            inputs.append(entry)
        casts = list(node.meta.get("ampgraph_casts", []))
        policy = node.meta.get("ampgraph_policy")
        outputs = _val_dtypes(node)
        where = f"{owner} ({fwd.module})" if fwd is not None and fwd.module else owner
        if phase == LOSS:
            reason = f"loss {LOSS_EXPRESSION} and its gradient"
        else:
            reason = f"backward of {where}"
        if casts:
            reason += ": autocast casts " + ", ".join(
                f"{c.node} {short_dtype(c.from_dtype)}->{short_dtype(c.to_dtype)}" for c in casts
            )
        records.append(NodeRecord(
            name=node.name,
            op=op_name(node.target),
            kind="loss" if phase == LOSS else "op",
            module=fwd.module if fwd is not None else None,
            module_call=fwd.module_call if fwd is not None else None,
            stack=list(fwd.stack) if fwd is not None else [],
            region=fwd.region if fwd is not None else None,
            autocast=trace.backward_autocast,
            inputs=inputs,
            policy=policy,
            casts=casts,
            outputs=outputs,
            reason=reason,
            forward=owner,
        ))  # fmt: skip
    return records


def _first(items: list[str | None]) -> str | None:
    return items[0] if items else None


def _gradients(trace: JointTrace) -> list[Gradient]:
    output = next(n for n in trace.graph_module.graph.nodes if n.op == "output")
    grads = list(output.args[0])
    by_name = {n.name: n for n in trace.graph_module.graph.nodes}
    out = []
    for (target, placeholder), grad in zip(trace.parameters, grads):
        node = by_name[placeholder]
        if not node.users and any(trace.capture.tied.get(t) == target or
                                  trace.capture.tied.get(target) == t
                                  for t, _p in trace.parameters if t != target):  # fmt: skip
            continue  # torch.export uses one placeholder for a tied parameter: listed once
        param = node.meta.get("val")
        out.append(Gradient(
            parameter=trace.capture.tied.get(target, target),
            param_dtype=dtype_name(param.dtype),
            dtype=_first(_val_dtypes(grad)) if isinstance(grad, fx.Node) else None,
            shape=list(param.shape),
            node=grad.name if isinstance(grad, fx.Node) else None,
        ))  # fmt: skip
    return out


def _saved(trace: JointTrace, forward: dict[str, NodeRecord]) -> list[SavedTensor]:
    state = trace.state
    storages: dict[int, int] = {}
    kinds = state.input_storages
    out = []
    for item in state.saved:
        t = item.tensor
        storage = t.untyped_storage()
        key = storage._cdata
        number = storages.setdefault(key, len(storages))
        kind = kinds.get(key, "activation")
        if kind == "activation" and key in state.copies.storages:
            kind = "parameter copy"
        fwd = forward.get(item.owner) if item.owner else None
        out.append(SavedTensor(
            node=item.owner or "",
            module=fwd.module if fwd is not None else None,
            dtype=dtype_name(t.dtype),
            shape=list(t.shape),
            bytes=t.numel() * t.element_size(),
            storage=number,
            storage_bytes=storage.nbytes(),
            kind=kind,
            producer=item.producer,
        ))  # fmt: skip
    return out


__all__ = [
    "JointAnnotator",
    "JointTrace",
    "LossError",
    "backward_section",
    "loss_output",
    "trace_device",
    "trace_joint",
]
