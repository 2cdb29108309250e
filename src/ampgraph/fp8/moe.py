"""MXFP8 training by torchao's own code: ``MXFP8TrainingOpConfig`` on grouped experts or Linears.

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

The same config trains a dense model's Linears (torchao's docstring: "the MXFP8 training config
for nn.Linear layers and grouped GEMM ops"): on a model without grouped experts the recipe wraps
each chosen ``nn.Linear``'s parameters, and the wrapper's ``__torch_function__`` sends
``F.linear`` to ``_to_mxfp8_then_scaled_mm`` (``mx_mm``, torchao's ``mxfp8_linear.py``): the
forward quantizes the input and the weight along K, ``grad_input``'s GEMM ``grad_output`` and
the weight along N, ``grad_weight``'s (unless ``wgrad_with_hp``) ``grad_output`` and the input
along the tokens M, each by ``MXTensor.to_mx``; so K, N and the token count must be multiples of
32. torchao 0.18's override passes ``F.linear`` its input and weight only: **the bias is
dropped** (its wrapped bias gets no gradient), which the plan says of each Linear with a bias.
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
#: What torchao's AUTO dense MXFP8 Linear needs, in the words of its assertion.
TRITON = ("torchao's AUTO MXFP8 Linear casts with Triton kernels (triton_to_mxfp8_dim0 in "
          "torchao/prototype/mx_formats/kernels.py raises AssertionError('needs triton') "
          "without them): give kernel=emulated (to_mx, dequantize, torch.mm)")
#: Why torchao's ``to_mx`` refuses a dense model's backward whose token count is no multiple of 32.
TOKENS = ("torchao's to_mx quantizes blocks of 32 along the last dimension, and grad_weight's "
          "GEMM quantizes grad_output and the input along the tokens: give a batch x sequence "
          "length that is a multiple of 32 (--seq-len), or mxfp8_rceil_wgrad_with_hp")
#: What a grouped GEMM with a bf16 and an fp32 operand does, fake and real.
MIXED_GROUPED = ("a grouped GEMM gets a bf16 and an fp32 operand (wgrad_with_hp's "
                 "torch._grouped_mm of the bf16 grad_output and the experts' input, saved as it "
                 "came: fp32 under autocast when the MoE's input is fp32); the fake kernel "
                 "refuses it, as the real CPU kernel does")
CONVERTED = ("grouped experts: parameters wrapped as MXFP8TrainingWeightWrapperTensor "
             "(MXFP8TrainingOpConfig): each torch._grouped_mm quantizes to MXFP8")
DENSE = ("parameters wrapped as MXFP8TrainingWeightWrapperTensor (MXFP8TrainingOpConfig): "
         "F.linear runs torchao's mx_mm, each GEMM's operands quantized to MXFP8")
NO_BIAS = ("; torchao 0.18's linear override drops the bias (F.linear gets input and weight "
           "only)")
BLOCK = 32


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


def has_experts(module: nn.Module) -> bool:
    """Whether any submodule holds grouped experts (else the recipe trains the Linears).

    >>> has_experts(nn.Sequential(nn.Linear(4, 4)))
    False
    """
    return any(is_experts(m) for m in module.modules())


def dense_fits(mod: nn.Module) -> str | None:
    """Why torchao's MXFP8 Linear cannot take ``mod`` (its ``to_mx`` blocks of 32 run along K in
    the forward and along N in ``grad_input``'s GEMM), or None when it can.

    >>> dense_fits(nn.Linear(64, 32)), dense_fits(nn.Linear(64, 10))
    (None, 'N=10 is not a multiple of 32 (one MX block along N for grad_input)')
    """
    n, k = mod.weight.shape
    if k % BLOCK:
        return f"K={k} is not a multiple of 32 (one MX block along K)"
    if n % BLOCK:
        return f"N={n} is not a multiple of 32 (one MX block along N for grad_input)"
    return None


def convert_moe(module: nn.Module, name: str, kernel: str,
                keep: Callable[[nn.Module, str], bool]) -> nn.Module:
    """A copy of ``module`` whose grouped experts ``keep`` accepts (a model without experts:
    whose ``nn.Linear`` s, K and N multiples of 32) are converted by torchao's ``quantize_``
    with :func:`config` (works on meta).

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
    if has_experts(module):
        def chosen(m: nn.Module, fqn: str) -> bool:
            return is_experts(m) and keep(m, fqn)
    else:
        def chosen(m: nn.Module, fqn: str) -> bool:
            return type(m) is nn.Linear and dense_fits(m) is None and keep(m, fqn)

    quantize_(out, config(name, kernel), filter_fn=chosen)
    return out


def expert_plans(module: nn.Module, keep: Callable[[nn.Module, str], bool],
                 filter_fqns: tuple[str, ...]) -> list[tuple[str, str, int, int, bool, str]]:
    """Every module with a 2-D or 3-D weight under an MXFP8 training recipe, as ``LinearPlan``'s
    fields: the grouped experts (converted unless filtered) and the dense ones, which the
    recipe leaves to autocast; in a model without experts, its Linears (:func:`dense_plans`)."""
    if not has_experts(module):
        return dense_plans(module, keep, filter_fqns)
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
    return plans


def dense_plans(module: nn.Module, keep: Callable[[nn.Module, str], bool],
                filter_fqns: tuple[str, ...]) -> list[tuple[str, str, int, int, bool, str]]:
    """Every module with a 2-D weight of a model without grouped experts under an MXFP8
    training recipe: an ``nn.Linear`` it trains in MXFP8, or kept, and why.

    >>> m = nn.Sequential(nn.Linear(64, 32, bias=False), nn.Linear(32, 10))
    >>> [p[4] for p in dense_plans(m, lambda m, f: True, ())]
    [True, False]
    """
    plans: list[tuple[str, str, int, int, bool, str]] = []
    for fqn, mod in module.named_modules():
        weight = getattr(mod, "weight", None)
        if not isinstance(weight, nn.Parameter) or weight.dim() != 2:
            continue
        kind, (n, k) = type(mod).__name__, weight.shape
        named = [f for f in filter_fqns if f in fqn]
        if type(mod) is not nn.Linear:
            reason = f"not an nn.Linear ({kind})"
        elif dense_fits(mod) is not None:
            reason = str(dense_fits(mod))
        elif named:
            reason = f"filtered by name (matches {named[0]!r})"
        elif not keep(mod, fqn):
            reason = "filtered"
        else:
            reason = DENSE + (NO_BIAS if mod.bias is not None else "")
            plans.append((fqn, kind, n, k, True, reason))
            continue
        plans.append((fqn, kind, n, k, False, reason))
    if not plans:
        raise SettingError("no nn.Linear and no grouped experts to convert: the MXFP8 training "
                           "recipe needs one or the other")
    return plans
