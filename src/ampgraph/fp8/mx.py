"""MXFP8 by torchao's own module code: the MX inference workflow, its weights flattened.

The recipes ``mxfp8`` and ``mxfp8_floor`` are torchao 0.18's MX inference workflow for a dense
Linear (its MX *training* of Linears, ``MXFP8TrainingOpConfig``, is :mod:`ampgraph.fp8.moe`'s
``mxfp8_rceil``): ``quantize_(model, MXDynamicActivationMXWeightConfig(...))`` turns each
Linear's weight into an ``MXTensor`` (e4m3 values, one E8M0 scale per 32 along K), and each
call quantizes the activation the same way (``MXTensor.to_mx``) and multiplies: with
``KernelPreference.AUTO`` by ``torch._scaled_mm`` on the E8M0 block scales (what an SM100 GPU
runs; the CPU kernel refuses block scales), with ``EMULATED`` by dequantizing both to bf16 and
``addmm`` (which runs on the CPU). Its forward traces on fake tensors once each ``MXTensor``
weight enters as its inner tensors (``__tensor_flatten__``) and is rebuilt inside the traced
function, so the graph holds torchao's amax, E8M0 exponent, e4m3 cast and GEMM.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ampgraph.torchutil import quiet_library_imports

#: MX recipe name -> torchao's ``ScaleCalculationMode`` member.
SCALE_MODES = {"mxfp8": "RCEIL", "mxfp8_floor": "FLOOR"}
BLOCK = 32


def quantize_mx(module: nn.Module, name: str, kernel: str,
                keep: Callable[[nn.Module, str], bool]) -> nn.Module:
    """A bf16 copy of ``module`` with the Linears ``keep`` accepts (and whose K is a multiple
    of 32) quantized by torchao's ``MXDynamicActivationMXWeightConfig`` (works on meta).

    >>> m = quantize_mx(nn.Sequential(nn.Linear(64, 32)), "mxfp8", "emulated", lambda m, f: True)
    >>> type(m[0].weight).__name__, m[0].weight.qdata.dtype
    ('MXTensor', torch.float8_e4m3fn)
    """
    with quiet_library_imports():
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.inference_workflow import (
            MXDynamicActivationMXWeightConfig,
        )
        from torchao.quantization import quantize_
        from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    config = MXDynamicActivationMXWeightConfig(
        kernel_preference=KernelPreference[kernel.upper()],
        scaling_mode=ScaleCalculationMode[SCALE_MODES[name]],
    )
    out = copy.deepcopy(module).to(torch.bfloat16)  # the workflow takes bf16 weights only

    def chosen(mod: nn.Module, fqn: str) -> bool:
        return type(mod) is nn.Linear and mod.in_features % BLOCK == 0 and keep(mod, fqn)

    quantize_(out, config, filter_fn=chosen)
    return out


def flatten(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``state`` with each tensor subclass (``MXTensor``) as its inner tensors (``NAME::qdata``)
    and what :func:`unflatten` needs to rebuild it."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    plain: dict[str, torch.Tensor] = {}
    subs: dict[str, Any] = {}
    for key, value in state.items():
        if is_traceable_wrapper_subclass(value):
            names, ctx = value.__tensor_flatten__()
            subs[key] = (type(value), names, ctx, value.shape, value.stride(),
                         value.requires_grad)
            plain.update({f"{key}::{n}": getattr(value, n) for n in names})
        else:
            plain[key] = value
    return plain, subs


def unflatten(plain: dict[str, Any], subs: dict[str, Any]) -> dict[str, Any]:
    """The state :func:`flatten` took apart, its subclasses rebuilt from ``plain``'s tensors
    (a trainable one, torchao's MXFP8 training weight, as a leaf that requires grad again)."""
    state = {k: v for k, v in plain.items() if "::" not in k}
    for key, (cls, names, ctx, shape, stride, grad) in subs.items():
        inner = {n: plain[f"{key}::{n}"] for n in names}
        state[key] = cls.__tensor_unflatten__(inner, ctx, shape, stride).requires_grad_(grad)
    return state
