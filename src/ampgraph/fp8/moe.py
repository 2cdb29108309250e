"""MXFP8 MoE training by torchao's own code: ``MXFP8TrainingOpConfig`` on grouped experts.

torchao 0.18 trains a mixture of experts' grouped GEMMs in MXFP8 through
``quantize_(model, MXFP8TrainingOpConfig(...))``: each parameter of a chosen module becomes an
``MXFP8TrainingWeightWrapperTensor``, whose ``__torch_function__`` sends ``torch._grouped_mm``
(2-D tokens x 3-D expert weights, with offsets) to ``_to_mxfp8_then_scaled_grouped_mm``, an
autograd function quantizing each GEMM's operands to MXFP8 (e4m3 values, one E8M0 scale per 32
along the reduction) in the forward, in ``grad_input``'s GEMM and, unless ``wgrad_with_hp``, in
``grad_weight``'s. Its ``AUTO`` kernels are SM100 CUDA, Triton and CuTe DSL code (guarded by an
``assert _SM100_KERNELS_AVAILABLE`` in ``_MXFP8GroupedMM.forward``, which fails on any other
machine, fake tensors included); its ``EMULATED`` kernel quantizes with ``to_mx``, dequantizes
to bf16 and runs ``torch._grouped_mm``, which the CPU runs. The recipes are torchao's
``MXFP8TrainingRecipe`` values, the config is built by its ``from_recipe``; this module decides
nothing torchao does not, and only words the reasons.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

from torch import nn

from ampgraph.errors import SettingError
from ampgraph.torchutil import quiet_library_imports

#: torchao's ``MXFP8TrainingRecipe`` values this recipe family takes (its third,
#: ``mxfp8_emulated_rceil``, is ``mxfp8_rceil,kernel=emulated`` here).
MOE_NAMES = ("mxfp8_rceil", "mxfp8_rceil_wgrad_with_hp")
#: What torchao's AUTO kernels need, in the words of the assertion that refuses them.
SM100 = ("torchao's AUTO MXFP8 grouped GEMM needs SM100 kernels (assert _SM100_KERNELS_AVAILABLE "
         "in torchao/prototype/moe_training/mxfp8_grouped_mm.py, _MXFP8GroupedMM.forward): "
         "give kernel=emulated (to_mx, dequantize, torch._grouped_mm)")
#: What a grouped GEMM with a bf16 and an fp32 operand does, fake and real.
MIXED_GROUPED = ("a grouped GEMM gets a bf16 and an fp32 operand (wgrad_with_hp's "
                 "torch._grouped_mm of the bf16 grad_output and the experts' input, saved as it "
                 "came: fp32 under autocast when the MoE's input is fp32); the fake kernel "
                 "refuses it, as the real CPU kernel does")
CONVERTED = ("grouped experts: parameters wrapped as MXFP8TrainingWeightWrapperTensor "
             "(MXFP8TrainingOpConfig): each torch._grouped_mm quantizes to MXFP8")


def config(name: str, kernel: str) -> Any:
    """torchao's ``MXFP8TrainingOpConfig`` for recipe ``name``, with kernel ``kernel``.

    >>> c = config("mxfp8_rceil_wgrad_with_hp", "emulated")
    >>> c.wgrad_with_hp, c.kernel_preference.name, c.scale_calculation_mode.name
    (True, 'EMULATED', 'RCEIL')
    """
    with quiet_library_imports():
        from torchao.prototype.moe_training.config import (
            MXFP8TrainingOpConfig,
            MXFP8TrainingRecipe,
        )
        from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    base = MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe(name))
    return dataclasses.replace(base, kernel_preference=KernelPreference[kernel.upper()])


def is_experts(module: nn.Module) -> bool:
    """A module holding a 3-D parameter of its own: stacked expert weights for grouped GEMMs."""
    return any(p.dim() == 3 for p in module.parameters(recurse=False))


def convert_moe(module: nn.Module, name: str, kernel: str,
                keep: Callable[[nn.Module, str], bool]) -> nn.Module:
    """A copy of ``module`` whose grouped experts ``keep`` accepts are converted by torchao's
    ``quantize_`` with :func:`config` (works on meta).

    >>> import torch
    >>> class E(nn.Module):
    ...     def __init__(self):
    ...         super().__init__(); self.w = nn.Parameter(torch.zeros(2, 64, 32))
    >>> m = convert_moe(nn.Sequential(E(), nn.Linear(32, 4)), "mxfp8_rceil", "emulated",
    ...                 lambda m, f: True)
    >>> type(m[0].w).__name__, type(m[1].weight).__name__
    ('MXFP8TrainingWeightWrapperTensor', 'Parameter')
    """
    with quiet_library_imports():
        from torchao.quantization import quantize_

    out = copy.deepcopy(module)
    quantize_(out, config(name, kernel), filter_fn=lambda m, fqn: is_experts(m) and keep(m, fqn))
    return out


def expert_plans(module: nn.Module, keep: Callable[[nn.Module, str], bool],
                 filter_fqns: tuple[str, ...]) -> list[tuple[str, str, int, int, bool, str]]:
    """Every module with a 2-D or 3-D weight under an MXFP8 MoE recipe, as ``LinearPlan``'s
    fields: the grouped experts (converted unless filtered) and the dense ones, which the
    recipe leaves to autocast."""
    plans: list[tuple[str, str, int, int, bool, str]] = []
    for fqn, mod in module.named_modules():
        kind = type(mod).__name__
        if is_experts(mod):
            p = next(p for p in mod.parameters(recurse=False) if p.dim() == 3)
            named = [f for f in filter_fqns if f in fqn]
            converted = not named and keep(mod, fqn)
            reason = CONVERTED if converted else (
                f"filtered by name (matches {named[0]!r})" if named else "filtered")
            plans.append((fqn, kind, p.shape[-2], p.shape[-1], converted, reason))
            continue
        weight = getattr(mod, "weight", None)
        if isinstance(weight, nn.Parameter) and weight.dim() == 2:
            plans.append((fqn, kind, *weight.shape, False,
                          "not grouped experts: the MoE recipe converts torch._grouped_mm's "
                          "expert weights only"))
    if not any(is_experts(m) for m in module.modules()):
        raise SettingError("no grouped experts to convert (a module holding a 3-D parameter "
                           "that torch._grouped_mm takes): the MXFP8 MoE recipe needs a MoE")
    return plans
