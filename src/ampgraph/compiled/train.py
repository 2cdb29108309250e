"""The backward under ``torch.compile``: the autocast state it is traced in, Inductor's plan for it,
and the gradient dtypes that follow.

``torch.compile`` traces a region's backward when it compiles the forward (AOT autograd's joint
graph), so the backward's autocast is not the one ``backward()`` is called in but
``torch._functorch.config.backward_pass_autocast``: ``"same_as_forward"`` (every supported
release's default, :data:`ampgraph.compat.BACKWARD_PASS_AUTOCAST_DEFAULT`) traces it in the
forward's autocast, as if ``backward()`` ran inside the context; ``"off"`` outside it, as eager's
AMP recipe calls it. :func:`plan_train` runs Inductor's ``compile_fx`` in training mode on
fake tensors (parameters requiring grad), forces the backward's lowering at compile time, and
records both graphs as :func:`ampgraph.compiled.inductor.plan` records one: which 16-bit
values each kernel keeps in fp32 (eager roundings dropped), by the lowered backward graph's node
names and the forward module each differentiates. :func:`ampgraph.compiled.flow.autocast_changes` compares two plans
(``"same_as_forward"`` against ``"off"``): the backward ops whose dtype the autocast state changes.

>>> import torch
>>> from ampgraph.model.build import ModelInputs
>>> from ampgraph.capture.trace import capture
>>> from ampgraph.settings import Setting
>>> c = capture(ModelInputs("m", torch.nn.Linear(8, 8), (torch.randn(4, 8),)),
...             Setting.parse("amp-fp32", device_type="cpu"))
>>> t = plan_train(c)
>>> t.backward_pass_autocast, [(g.input, g.dtype) for g in t.gradients]
('same_as_forward', [('weight', 'float32'), ('bias', 'float32')])
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from ampgraph import compat
from ampgraph.capture.trace import Capture
from ampgraph.compiled.flow import BackwardOp, CompiledFlow, CompiledTrain, Gradient
from ampgraph.compiled.inductor import (
    CompiledPlanError,
    _root_name,
    build_flow,
    inductor_setting,
    recording,
)
from ampgraph.torchutil import dtype_name

#: The ``backward_pass_autocast`` values a plan takes: the two named states (a list of autocast
#: keyword dicts, torch's third form, is passed through as it is).
STATES = ("same_as_forward", "off")


def plan_train(
    capture: Capture, *, emulate_precision_casts: bool = False,
    backward_pass_autocast: str | list[dict[str, Any]] | None = None,
) -> CompiledTrain:  # fmt: skip
    """Inductor's plan for ``capture``'s forward and backward in its setting, the backward traced
    under ``backward_pass_autocast`` (None: the installed torch's configured value)."""
    from torch._functorch import config as functorch_config

    from ampgraph.compiled.breaks import has_breaks

    if has_breaks(capture.graph_module):
        raise CompiledPlanError(
            "this model has torch.compiler.disable regions (graph breaks): the train plan covers "
            "one compiled graph; ampgraph compiled without --pass train plans each graph"
        )
    state = functorch_config.backward_pass_autocast if backward_pass_autocast is None else (
        backward_pass_autocast)  # fmt: skip
    gm = capture.graph_module
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    trainable = [capture.input_kinds[n.name][0] == "parameter"
                 and n.meta["val"].is_floating_point() for n in places]  # fmt: skip
    inputs = [n.meta["val"].detach().requires_grad_(t) for n, t in zip(places, trainable)]
    graphs: list[fx.GraphModule] = []
    lowered = _lower_both(capture, inputs, graphs, state, emulate_precision_casts)
    (fw_graph, fw_values), (bw_graph, bw_values) = lowered
    names = {n.name for n in gm.graph.nodes if n.op == "call_function"}
    fw_owner = {n: r for n in fw_values if (r := _root_name(n, names)) is not None}
    forward = build_flow(gm, fw_graph, fw_values, fw_owner, capture, emulate_precision_casts)
    bw_gm = graphs[1]  # lowered in place: its nodes are the lowered graph's
    bw_owner = {n: n.name for n in bw_values if n.op == "call_function"}
    backward = build_flow(bw_gm, bw_graph, bw_values, bw_owner, capture, emulate_precision_casts)
    backward.model = f"{capture.model_name} (backward)"
    return CompiledTrain(
        forward, backward, state if isinstance(state, str) else repr(state),
        compat.backward_pass_autocast_default(), _autocast_applies(capture, state),
        _gradients(capture, places, trainable, bw_gm), _ops(graphs[0], bw_gm, backward),
    )  # fmt: skip


def _lower_both(
    capture: Capture, inputs: list[Any], graphs: list[fx.GraphModule], state: Any, emulate: bool
) -> list[tuple[Any, dict[fx.Node, Any]]]:
    """Lower the forward and the backward (recorded, nothing compiled), the graphs in ``graphs``."""
    from torch._functorch import config as functorch_config
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor import compile_fx

    def inner(g: fx.GraphModule, example: list[Any], **kwargs: Any) -> Any:
        graphs.append(g)
        try:
            compile_fx.compile_fx_inner(g, example, **kwargs)
        except Exception as exc:  # noqa: BLE001 - Inductor wraps ours in InductorError
            if len(made) < len(graphs):
                raise CompiledPlanError(f"Inductor could not lower the graph: {exc}") from exc
        return make_boxed_func(g.forward)  # never run: the plan only needs the lowering

    patch = functorch_config.patch(backward_pass_autocast=state, **compat.compiled_backward_lowering())
    with inductor_setting(capture, emulate), patch, recording() as made, torch.enable_grad():
        compile_fx.compile_fx(capture.graph_module, inputs, inner_compile=inner)
    if len(made) < 2:
        raise CompiledPlanError(
            f"torch {torch.__version__} lowers a compiled backward only when it first runs "
            "(no force_non_lazy_backward_lowering before 2.10): the train plan needs torch 2.10+"
            if not compat.compiled_backward_lowering()
            else "AOT autograd made no backward graph: no parameter of this model needs a gradient"
        )
    return made[:2]


def _autocast_applies(capture: Capture, state: Any) -> bool:
    s = capture.setting
    if state == "same_as_forward":
        return s.autocast
    if state == "off":
        return False
    return any(kw.get("device_type") == s.device_type and kw.get("enabled", True) for kw in state)


def _gradients(
    capture: Capture, places: list[fx.Node], trainable: list[bool], bw: fx.GraphModule
) -> list[Gradient]:
    """The backward's outputs, one per forward input (None where it needs none), by name."""
    outs = next(n for n in bw.graph.nodes if n.op == "output").args[0]
    found = []
    for place, wanted, out in zip(places, trainable, outs):
        if wanted and isinstance(out, fx.Node):
            found.append(Gradient(capture.input_kinds[place.name][1],
                                  dtype_name(out.meta["val"].dtype),
                                  dtype_name(place.meta["val"].dtype)))  # fmt: skip
    return found


def _ops(fw: fx.GraphModule, bw: fx.GraphModule, flow: CompiledFlow) -> list[BackwardOp]:
    modules = {n.name: n.module for n in flow.nodes}
    # autograd's sequence numbers count on from trace to trace: counted from the forward's first,
    # they are what two traces of the same forward share
    base = min((n.meta["seq_nr"] for n in fw.graph.nodes if n.meta.get("seq_nr") is not None),
               default=0)  # fmt: skip
    return [BackwardOp(n.name, _op_name(n), modules.get(n.name, ""),
                       dtype_name(n.meta["val"].dtype),
                       None if n.meta.get("seq_nr") is None else n.meta["seq_nr"] - base)
            for n in bw.graph.nodes
            if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)]  # fmt: skip


def _op_name(n: fx.Node) -> str:
    target = n.target
    return target.name() if isinstance(target, torch._ops.OpOverload) else str(target)
