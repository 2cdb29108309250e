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

import contextlib
import inspect
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx._lazy_graph_module import _use_lazy_graph_module
from torch.fx.experimental import proxy_tensor
from torch.utils import _pytree as pytree

from ampgraph.capture.environment import in_analysis_environment
from ampgraph.annotate.replay import (
    Failed,
    StrictDtypeMode,
    dtype_names,
    op_name,
    placeholder_value,
)
from ampgraph.capture.trace import Capture
from ampgraph.compat import make_fx_keeps_fused_kernels
from ampgraph.errors import AmpgraphError, AnalysisError, first_line
from ampgraph.report.records import Backward, Gradient, NodeRecord, SavedTensor
from ampgraph.settings import short_dtype
from ampgraph.torchutil import autocast_state, dtype_name
from ampgraph.train.joint_annotator import (
    BackwardAutocast,
    CpuMixedNorms,
    JointAnnotator,
    ParameterCopies,
)
from ampgraph.train.joint_state import (
    ACTIVE,
    AUTOCAST_CAST,
    BACKWARD,
    FORWARD,
    INPUT,
    LOSS,
    OWNER,
    Packed,
    TraceState,
    trace_device,
)

LOSS_EXPRESSION = "output.float().sum()"
METHOD = "make_fx over the annotated forward + loss + torch.autograd.grad"


class LossError(AmpgraphError):
    """The loss cannot be taken from the model's output (no floating tensor, unknown --loss)."""


# -- choosing the output the loss reduces --------------------------------------------------------
def loss_output(cap: Capture, loss: str | int | None, values: list[Any] | None = None) -> int:
    """Index (among the capture's user outputs) of the output the loss reduces.

    ``loss`` is an output's path (``logits``, ``0``, ``aux.1``; see ``Capture.output_paths``), an
    integer index into the model's outputs, or None: the first floating-point output.
    ``values`` are the outputs' values where known, to find floating ones.
    """
    paths = cap.output_paths or [str(i) for i in range(len(values or []))]
    whole = _user_output_nodes(cap) if values is None and len(paths) == 1 else []
    if whole and not isinstance(whole[0], fx.Node):
        # The whole output is a constant (None, a string): its type says more than a path.
        choices = f"a {type(whole[0]).__name__}"
    else:
        choices = ", ".join(paths) or "none"

    def floating(i: int) -> bool:
        if values is None:
            # A constant output (``(None, y)``, ``(3, y)``, a string) is no graph node.
            node = _user_output_nodes(cap)[i]
            val = node.meta.get("val") if isinstance(node, fx.Node) else node
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


@in_analysis_environment
def trace_joint(
    cap: Capture, *, loss: str | int | None = None, backward_autocast: bool = False
) -> JointTrace:
    """Trace forward + ``output.float().sum()`` + ``torch.autograd.grad`` of ``cap``."""
    setting = cap.setting
    device = trace_device(setting)
    kinds, values, trainable = _joint_inputs(cap, device)
    plan = _Step(cap, device, kinds, trainable, loss_output(cap, loss), backward_autocast)
    outcome: dict[str, Any] = {}

    def step(*inputs: Any) -> Any:
        mode = proxy_tensor.get_proxy_mode()
        state = TraceState(setting, mode.tracer.graph, mode.tracer)
        token = ACTIVE.set(state)
        try:
            grads, outcome["skipped"] = _training_step(plan, state, list(inputs))
            return grads
        finally:
            ACTIVE.reset(token)
            outcome["state"] = state

    with _quiet(), _use_lazy_graph_module(True), make_fx_keeps_fused_kernels():
        # Nothing calls the joint graph's Python code (the oracle interprets its nodes), so it is
        # compiled only if something does; the torch-function metadata make_fx records by
        # default (node.meta["torch_fn"]) is read by nothing here and costs every call a mode.
        gm = proxy_tensor.make_fx(step, tracing_mode="real", **_LEAN_MAKE_FX)(*values)
    state = outcome["state"]
    joint_placeholders = [p for p in gm.graph.nodes if p.op == "placeholder"]
    _attribute(gm, state)
    paths, index = cap.output_paths, plan.loss_index
    return JointTrace(
        capture=cap,
        graph_module=gm,
        state=state,
        loss_index=index,
        loss_path=paths[index] if index < len(paths) else str(index),
        backward_autocast=backward_autocast and setting.autocast,
        input_kinds={jp.name: kind for jp, kind in zip(joint_placeholders, kinds)},
        parameters=[(kinds[i][1], joint_placeholders[i].name) for i in trainable],
        skipped=outcome.get("skipped"),
    )


def _joint_inputs(cap: Capture, device: str) -> tuple[list[tuple[str, str]], list[Any], list[int]]:
    """The capture's placeholders as the joint trace takes them: each one's (kind, target), a
    fake value of it on ``device``, and the indices of the trainable (floating) parameters."""
    placeholders = [p for p in cap.graph_module.graph.nodes if p.op == "placeholder"]
    kinds = [cap.input_kinds.get(p.name, ("input", p.name)) for p in placeholders]
    with FakeTensorMode(allow_non_fake_inputs=True):
        values = [placeholder_value(p, device) for p in placeholders]
    trainable = [
        i for i, (kind, _t) in enumerate(kinds)
        if kind == "parameter" and isinstance(values[i], torch.Tensor)
        and values[i].is_floating_point()
    ]  # fmt: skip
    return kinds, values, trainable


@dataclass(frozen=True)
class _Step:
    """What one traced training step is asked to do: the capture to replay on the device it
    traces on, its inputs' kinds, which of them train, the output the loss reduces, and whether
    backward runs under autocast."""

    capture: Capture
    device: str
    kinds: list[tuple[str, str]]
    trainable: list[int]
    loss_index: int
    backward_autocast: bool

    def norms(self) -> contextlib.AbstractContextManager[Any]:
        """The real CPU normalisations' dtypes: a dispatch mode costs every op a trip through
        Python, so this one only where it acts."""
        return CpuMixedNorms() if self.device == "cpu" else contextlib.nullcontext()


def _training_step(
    plan: _Step, state: TraceState, inputs: list[Any]
) -> tuple[list[Any], str | None]:
    """The step make_fx traces: the annotated forward, the loss, ``loss.backward()``; the
    trainable parameters' gradients, and why there is no backward (or None)."""
    params = _mark_inputs(plan, state, inputs)
    annotator, out = _annotated_forward(plan, state, inputs)
    flat = list(pytree.tree_leaves(out))
    paths = plan.capture.output_paths
    user = flat[len(flat) - len(paths) :] if paths else flat
    failed = [v for v in flat if isinstance(v, Failed)]
    chosen = user[plan.loss_index] if plan.loss_index < len(user) else None
    if failed or not isinstance(chosen, torch.Tensor) or not chosen.requires_grad:
        skipped = (
            f"the forward failed at {failed[0].node}: there is no backward to run"
            if failed
            else "the chosen output does not depend on any parameter"
        )
        return [None] * len(params), skipped
    _loss_backward(plan, state, annotator, chosen)
    return [p.grad for p in params], None


def _mark_inputs(plan: _Step, state: TraceState, inputs: list[Any]) -> list[torch.Tensor]:
    """Record which storages are inputs of which kind, and make the trainable parameters
    require grad (in ``inputs``); those parameters."""
    storages: dict[int, tuple[str, str]] = {}
    for i, (kind, target) in enumerate(plan.kinds):
        t = inputs[i]
        if isinstance(t, torch.Tensor):
            storages.setdefault(t.untyped_storage()._cdata, (kind, target))
    params = []
    for i in plan.trainable:
        inputs[i] = inputs[i].requires_grad_(True)
        params.append(inputs[i])
    state.input_storages = {key: kind for key, (kind, _target) in storages.items()}
    return params


def _annotated_forward(
    plan: _Step, state: TraceState, inputs: list[Any]
) -> tuple[JointAnnotator, Any]:
    """The forward as ampgraph annotates it (autocast off, its casts explicit), every tensor
    autograd saves seen by a pack hook; the annotator and the forward's output."""
    setting = plan.capture.setting

    def pack(t: torch.Tensor) -> torch.Tensor:
        owner = state.stack[-1][1] if state.stack else None
        node = state.node_of(t)
        state.saved.append(Packed(owner, t, node.name if node is not None else None))
        return t

    annotator = JointAnnotator(plan.capture)
    copies = ParameterCopies(
        {k for k, kind in state.input_storages.items() if kind in ("parameter", "buffer")}
    )
    state.copies = copies
    with (
        copies,
        plan.norms(),
        StrictDtypeMode(setting.device_type),
        autocast_state("cpu", False, torch.get_autocast_dtype("cpu")),
        autocast_state("cuda", False, torch.get_autocast_dtype("cuda")),
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
    ):
        out = annotator.run(*inputs)
    state.forward_records = annotator.records
    return annotator, out


def _loss_backward(
    plan: _Step, state: TraceState, annotator: JointAnnotator, chosen: torch.Tensor
) -> None:
    """``chosen.float().sum().backward()``, each op attributed to the loss or the backward."""
    cap = plan.capture
    state.enter((LOSS, None))
    value = chosen.float().sum()
    _hook_backward(state, value)
    scope = (
        BackwardAutocast(annotator)
        if plan.backward_autocast and cap.setting.autocast
        else contextlib.nullcontext()
    )
    state.enter((BACKWARD, None))
    # The real CPU kernels' dtypes in the backward too, under autocast's casts where it runs
    # inside the context (the mode entered first sees each op after the one entered last).
    with plan.norms(), scope:
        # loss.backward(), as a training step calls it: the engine accumulates each
        # gradient into .grad as it does for real (a copy where strides must change).
        try:
            value.backward()
        except Exception as exc:  # the model's own backward: a custom op without a formula
            raise AnalysisError(
                f"the backward of {cap.model_name!r} cannot be traced: {first_line(exc)} "
                "(a real training step raises this too; analyse it with --pass forward)"
            ) from exc


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
