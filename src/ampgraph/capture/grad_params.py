"""Which parameters require grad, kept on the graph's placeholders for the replays.

A traced graph's placeholder values say nothing of ``requires_grad`` (the forward is traced
under ``torch.no_grad()``), yet a real run's kernels depend on it: ``matmul``
(``aten/src/ATen/native/LinearAlgebra.cpp``, ``should_fold``) folds an N-D input into one ``mm``
whenever the weight requires grad, under ``no_grad`` and ``inference_mode`` too, and otherwise
only where the input's leading dimensions view as one; unfolded, a bias-free ``nn.Linear``
runs ``bmm``, whose dtype error differs (:mod:`ampgraph.annotate.cpu_bmm`). The capture marks
each placeholder whose parameter requires grad in the model; the fake replays and verify's real
values give those tensors ``requires_grad`` as the model's parameters have it.

>>> import torch
>>> from torch import fx, nn
>>> gm = fx.symbolic_trace(nn.Linear(2, 2))
>>> mark_requires_grad(gm, {"weight": ("parameter", "weight")}, nn.Linear(2, 2))
>>> [requires_grad(n) for n in gm.graph.nodes if n.op == "placeholder"]
[False]
"""

from __future__ import annotations

from torch import fx, nn

#: The placeholder meta key: True where the node's parameter requires grad in the model.
REQUIRES_GRAD = "ampgraph_requires_grad"


def mark_requires_grad(
    gm: fx.GraphModule, kinds: dict[str, tuple[str, str]], module: nn.Module
) -> None:
    """Mark ``gm``'s parameter placeholders (``kinds``: name -> (kind, qualified target)) whose
    parameter in ``module`` requires grad."""
    params = dict(module.named_parameters(remove_duplicate=False))
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        kind, target = kinds.get(node.name, ("input", node.name))
        param = params.get(target)
        if kind == "parameter" and param is not None and param.requires_grad:
            node.meta[REQUIRES_GRAD] = True


def requires_grad(node: fx.Node) -> bool:
    """Whether the capture marked ``node``'s parameter as requiring grad."""
    return bool(node.meta.get(REQUIRES_GRAD, False))


__all__ = ["REQUIRES_GRAD", "mark_requires_grad", "requires_grad"]
