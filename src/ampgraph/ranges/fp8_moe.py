"""Will a MoE's grouped GEMMs survive MXFP8? Their operands from one real fp32 run.

Under torchao's MXFP8 MoE recipe (:mod:`ampgraph.fp8.moe`) each ``torch._grouped_mm(tokens,
weight.transpose(-2, -1), offs=...)`` of a converted module quantizes its operands with
``to_mx`` (one E8M0 scale per 32 values along the reduction): the tokens ``(M, K)`` and the
weight ``(E, N, K)`` along K in the forward; ``grad_output`` ``(M, N)`` and the weight along N
for ``grad_input``; and, unless ``wgrad_with_hp``, ``grad_output`` and the tokens along M (the
tokens, all groups together, as its emulated kernel does) for ``grad_weight``. A
``TorchFunctionMode`` records each grouped GEMM's tokens and weight in the unconverted model's
fp32 run (and a hook the gradient of its output), each laid out with its reduction last, so the
per-32 block rule of :mod:`ampgraph.ranges.fp8` applies as it is.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ampgraph.fp8.graph import train_loss
from ampgraph.fp8.moe import config
from ampgraph.fp8.recipes import Fp8Recipe, plan_model
from ampgraph.model.build import ModelInputs


def moe_operand_formats(recipe: Fp8Recipe, *, train: bool) -> dict[str, tuple[str, str, bool]]:
    """Each operand the MoE recipe casts -> (format, scaling, power-of-two scales), read from
    torchao's ``MXFP8TrainingOpConfig``.

    >>> from ampgraph.fp8.recipes import parse_fp8_recipe
    >>> sorted(moe_operand_formats(parse_fp8_recipe("torchao:mxfp8_rceil_wgrad_with_hp"),
    ...                            train=True))
    ['grad_output', 'input', 'weight', 'weight_for_grad_input']
    """
    c = config(recipe.name, recipe.kernel)
    mx = ("e4m3", f"mx-{c.scale_calculation_mode.name.lower()}", True)
    roles = ["input", "weight"]
    if train:
        roles += ["grad_output", "weight_for_grad_input"]
        if not c.wgrad_with_hp:
            roles += ["grad_output_for_grad_weight", "input_for_grad_weight"]
    return dict.fromkeys(roles, mx)


class _GroupedLog(TorchFunctionMode):
    """Records each ``torch._grouped_mm`` on a named weight: its tokens, weight and output."""

    def __init__(self, names: dict[int, str], train: bool) -> None:
        super().__init__()
        self.names, self.train = names, train
        self.seen: dict[str, dict[str, torch.Tensor]] = {}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") != "_grouped_mm" or len(args) < 2:
            return out
        tokens, weight_t = args[0], args[1]
        name = self.names.get(id(weight_t._base)) if weight_t._base is not None else None
        if name is None or name in self.seen:
            return out
        x, w = tokens.detach().float(), weight_t.detach().float().transpose(-2, -1)  # (E,N,K)
        record = {"input": x.contiguous(), "weight": w.reshape(-1, w.shape[-1]).contiguous(),
                  "weight_for_grad_input": w.transpose(-2, -1).reshape(-1, w.shape[-2])
                  .contiguous(), "input_for_grad_weight": x.t().contiguous()}
        self.seen[name] = record
        if self.train and out.requires_grad:
            def keep(grad: torch.Tensor) -> None:
                g = grad.detach().float()
                record["grad_output"] = g.contiguous()
                record["grad_output_for_grad_weight"] = g.t().contiguous()

            out.register_hook(keep)
        return out


def moe_operands(model: ModelInputs, recipe: Fp8Recipe, state: dict[str, torch.Tensor], *,
                 train: bool = False) -> dict[str, dict[str, torch.Tensor]]:
    """Each converted module's grouped GEMM operands from one real fp32 run (forward, and with
    ``train`` the backward of :func:`ampgraph.fp8.graph.train_loss`), keyed by module, each
    operand named ``WEIGHT.ROLE`` (``w1.input``) and laid out with its reduction last."""
    converted = {p.fqn for p in plan_model(model.module, recipe) if p.converted}
    names = [k for k, _ in model.module.named_parameters()]
    names += [k for k, _ in model.module.named_buffers()]
    params = {k: state[k].detach().clone() for k in names if k in state}
    trainable = [p.requires_grad_() for p in params.values() if p.is_floating_point()] \
        if train else []
    log = _GroupedLog({id(v): k for k, v in params.items()}, train)
    with torch.set_grad_enabled(train):
        with log:
            out = torch.func.functional_call(model.module, params, model.args, model.kwargs)
        if train:
            torch.autograd.grad(train_loss(out), trainable, allow_unused=True)
    seen: dict[str, dict[str, torch.Tensor]] = {}
    for name, record in log.seen.items():
        module, _, weight = name.rpartition(".")
        if module in converted:
            seen.setdefault(module, {}).update({f"{weight}.{k}": v for k, v in record.items()})
    return seen
