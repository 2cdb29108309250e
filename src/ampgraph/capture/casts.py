"""What a precision recipe does around the forward: its input and output casts, as tensors.

A :class:`~ampgraph.settings.Setting` says (torch-free) which dtype a recipe casts the forward's
floating inputs and outputs to (``input_dtype``, ``output_dtype``, :mod:`ampgraph.recipes`);
here is the one torch-side reading of that, which the capture, the eager oracles and the real
runs share: :func:`cast_floating` on a tree of tensors, :func:`cast_outputs` around a module's
forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ampgraph.settings import Setting
from ampgraph.torchutil import torch_dtype

#: What a recipe's output cast converts: Accelerate's convert_outputs_to_fp32 leaves fp64 alone.
OUTPUT_CAST_FROM = (torch.float16, torch.bfloat16, torch.float32)


def cast_floating(
    value: Any, dtype: str | None, *, outputs: bool = False, every: bool = False
) -> Any:
    """``value`` (a tree of tensors) with its floating tensors cast to ``dtype``, as a recipe
    casts a forward's inputs (every floating tensor: FSDP2's ``_cast_fp_tensor``, Lightning's
    ``_convert_fp_tensor``) or, with ``outputs``, its outputs (fp16, bf16 and fp32 ones); None
    casts nothing. A tensor already in ``dtype`` is left as it is, as the frameworks do, unless
    ``every``: a graph traced in other dtypes than its setting's (on meta, or neutral after a
    raise) records the cast, which its replay in the setting's dtypes then makes.

    >>> cast_floating((torch.ones(1), torch.ones(1, dtype=torch.int64)), "bfloat16")[0].dtype
    torch.bfloat16
    >>> cast_floating({"x": torch.ones(1, dtype=torch.float64)}, "float32", outputs=True)["x"].dtype
    torch.float64
    """
    if dtype is None:
        return value
    target = torch_dtype(dtype)

    def cast(t: torch.Tensor) -> torch.Tensor:
        castable = t.dtype in OUTPUT_CAST_FROM if outputs else t.is_floating_point()
        return t.to(target) if castable and (every or t.dtype != target) else t

    return pytree.tree_map_only(torch.Tensor, cast, value)


@contextlib.contextmanager
def cast_outputs(
    module: nn.Module, setting: Setting | None, *, every: bool = False
) -> Iterator[None]:
    """``module``'s forward casting its floating outputs to the setting's output dtype, as the
    recipe does after the forward (Accelerate's ``convert_outputs_to_fp32`` wraps the forward
    on the instance; FSDP2's ``output_dtype`` casts in the root's post-forward hook): traced,
    the casts are nodes of the graph, annotated and checked as any op. The forward is swapped
    on the instance, so every module path stays as it is. ``every``: as :func:`cast_floating`.

    >>> lin = nn.Linear(2, 2).to(torch.bfloat16)
    >>> with cast_outputs(lin, Setting.parse("half,outputs=fp32")):
    ...     lin(torch.ones(2, dtype=torch.bfloat16)).dtype
    torch.float32
    >>> "forward" in vars(lin)
    False
    """
    if setting is None or setting.output_dtype is None:
        yield
        return
    dtype = setting.output_dtype
    forward = module.forward
    had = "forward" in vars(module)

    def casting(*args: Any, **kwargs: Any) -> Any:
        return cast_floating(forward(*args, **kwargs), dtype, outputs=True, every=every)

    module.forward = casting  # type: ignore[method-assign]
    try:
        yield
    finally:
        if had:
            module.forward = forward  # type: ignore[method-assign]
        else:  # the class's forward again (an inner swap may have removed ours already)
            vars(module).pop("forward", None)


__all__ = ["OUTPUT_CAST_FROM", "cast_floating", "cast_outputs"]
