"""The fp32 reference run's backward: the same loss as ``--pass train``, differentiated for real.

:class:`GradRun` is :class:`~ampgraph.ranges.collect.RangeRun` with autograd on: the parameters
are leaves that require grad, and every floating output that requires grad gets a tensor hook
that reduces the gradient flowing into it (the gradient of the loss with respect to that node's
output) to a :class:`~ampgraph.ranges.data.ValueRange` and drops it. The loss is the one
ampgraph's train pass differentiates (:data:`ampgraph.train.backward.LOSS_EXPRESSION`: the first
floating output, or the one ``loss`` names, ``.float().sum()``); ``loss.backward()`` then fills
each parameter's ``.grad``, which is reduced the same way. Memory is an eager training step's:
the weights, the activations autograd saves, and one gradient at a time.

>>> import torch
>>> from ampgraph.capture.trace import capture
>>> from ampgraph.model.build import ModelInputs
>>> from ampgraph.settings import Setting
>>> lin = torch.nn.Linear(2, 1)
>>> cap = capture(ModelInputs("lin", lin, (torch.ones(3, 2),)), Setting.parse("fp32,device=cpu"))
>>> values = [lin.weight, lin.bias, torch.ones(3, 2)]
>>> run = run_gradients(cap, values, {}, {}, None)
>>> run.parameters["weight"].max_abs, run.parameters["bias"].max_abs   # sum over 3 rows of ones
(3.0, 3.0)
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from ampgraph.capture.regions import region_args
from ampgraph.capture.trace import Capture
from ampgraph.ranges.collect import RangeRun, reduce_tensor
from ampgraph.ranges.data import NodeRange, ValueRange
from ampgraph.torchutil import autocast_state


class GradRun(RangeRun):
    """A :class:`RangeRun` that keeps autograd's graph and hooks each output's gradient.

    ``grads`` (node name -> one :class:`ValueRange` or None per output, as ``ranges``) is shared
    with region bodies, as ``ranges`` is.
    """

    def __init__(self, *args: Any, grads: dict[str, list[ValueRange | None]] | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        self.grads: dict[str, list[ValueRange | None]] = grads if grads is not None else {}

    def _hook(self, name: str, leaves: list[Any]) -> None:
        slots: list[ValueRange | None] = [None] * len(leaves)
        hooked = False
        for i, v in enumerate(leaves):
            if isinstance(v, torch.Tensor) and v.is_floating_point() and v.requires_grad:

                def record(g: torch.Tensor, i: int = i) -> None:
                    slots[i] = reduce_tensor(g)

                v.register_hook(record)
                hooked = True
        if hooked:
            self.grads[name] = slots

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        name = self.qualified(n)
        if n.op in ("call_function", "call_method", "call_module") and name in self.ranges:
            self._hook(name, list(pytree.tree_leaves(value)))
        return value

    def run_region(self, n: fx.Node, args: tuple[Any, ...]) -> Any:
        region = region_args(n, args)
        child = GradRun(
            region.body, self.setting, self.modules, self.kinds, self.ranges,
            prefix=f"{self.prefix}{n.name}.", grads=self.grads,
        )  # fmt: skip
        return self.run_body(child, region.body, region.operands, n)


@dataclass
class GradientRun:
    """What the reference backward measured: each node's forward ranges and gradients."""

    #: Node name -> its forward outputs' ranges (as :func:`~ampgraph.ranges.collect.run_ranges`).
    forward: dict[str, NodeRange]
    #: Node name -> the range of the gradient flowing into each of its outputs (None: none).
    nodes: dict[str, list[ValueRange | None]] = field(default_factory=dict)
    #: Parameter name (tied ones by their first name) -> the range of its ``.grad``.
    parameters: dict[str, ValueRange] = field(default_factory=dict)
    #: The output the loss reduces (its path) and the loss's value.
    loss_output: str = ""
    loss: float = 0.0


def _user_outputs(cap: Capture, result: Any) -> list[Any]:
    flat = list(pytree.tree_leaves(result))
    # torch.export returns mutated buffers first, then the user's outputs.
    return flat[len(flat) - len(cap.output_paths) :] if cap.output_paths else flat


def _leaves(cap: Capture, values: Sequence[Any]) -> tuple[list[Any], dict[str, torch.Tensor]]:
    """``values`` with each floating parameter a fresh leaf that requires grad (by target)."""
    placeholders = [p for p in cap.graph_module.graph.nodes if p.op == "placeholder"]
    out, params = list(values), {}
    for i, p in enumerate(placeholders):
        kind, target = cap.input_kinds.get(p.name, ("input", p.name))
        v = out[i]
        if kind == "parameter" and isinstance(v, torch.Tensor) and v.is_floating_point():
            out[i] = v.detach().requires_grad_(True)
            params.setdefault(cap.tied.get(target, target), out[i])
    return out, params


def run_gradients(
    cap: Capture,
    values: Sequence[Any],
    modules: dict[str, str | None],
    kinds: dict[str, str],
    loss: str | int | None,
) -> GradientRun:
    """Run ``cap``'s graph on ``values`` in fp32 with autograd, take the train pass's loss, and
    run its backward: every node's forward range, the gradient into each output, each ``.grad``.

    A forward that raises leaves no loss: the gradients are empty (the forward's error is in the
    node ranges, as without ``--pass train``).
    """
    from ampgraph.train.backward import loss_output

    leaves, params = _leaves(cap, values)
    interp = GradRun(cap.graph_module, cap.setting, modules, kinds)
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.enable_grad())
        for device in ("cpu", "cuda"):
            stack.enter_context(autocast_state(device, False, torch.get_autocast_dtype(device)))
        result = interp.run(*leaves)
        del leaves
        outputs = _user_outputs(cap, result)
        run = GradientRun(interp.ranges)
        if any(r.error is not None for r in interp.ranges.values()):
            return run
        index = loss_output(cap, loss, outputs)
        paths = cap.output_paths or [str(i) for i in range(len(outputs))]
        value = outputs[index].float().sum()  # ampgraph.train.backward.LOSS_EXPRESSION
        del result, outputs
        if value.requires_grad:  # no trainable parameter reaches the loss: no gradients
            value.backward()
    run.loss_output, run.loss = paths[index], float(value.detach())
    run.nodes = interp.grads
    run.parameters = {t: reduce_tensor(p.grad) for t, p in params.items() if p.grad is not None}
    return run


__all__ = ["GradRun", "GradientRun", "run_gradients"]
