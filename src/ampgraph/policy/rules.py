"""Autocast's rules for one call, as ``autocast_mode.h`` writes them, applied to tensors.

The tables (:mod:`ampgraph.policy`) say which category an op is in; these functions say what the
category does to one call: which tensors are eligible for a cast (``is_eligible``), the dtype a
``promote`` op runs in (``promote_type``), the ``dtype=`` that ``fp32_set_opt_dtype`` adds, and the
overload ``fp32_append_dtype`` redispatches to. The annotator (:mod:`ampgraph.annotate.annotator`) applies
them on fake tensors; verify (:mod:`ampgraph.verify.cast_log`) replays a call the way they say
autocast makes it. The dispatcher check (:mod:`ampgraph.annotate.check`) uses none of this: it runs the
real autocast kernels, which is what makes it a proof.

>>> import torch
>>> is_eligible(torch.ones(1), "cpu"), is_eligible(torch.ones(1, dtype=torch.float64), "cpu")
(True, False)
"""

from __future__ import annotations

from typing import Any

import torch

from ampgraph.policy import APPEND_DTYPE_REDISPATCH, entry_name
from ampgraph.torchutil import device_type_of, tensor_leaves


def is_eligible(t: Any, device_type: str) -> bool:
    """``is_eligible``: a floating tensor on the device autocast is enabled for, and not fp64."""
    return (
        isinstance(t, torch.Tensor)
        and device_type_of(t) == device_type
        and t.is_floating_point()
        and t.dtype != torch.float64
    )


def first_argument(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The argument the fp32_set_opt_dtype and fp32_append_dtype wrappers test for eligibility."""
    return args[0] if args else next(iter(kwargs.values()), None)


def dtype_position(op: torch._ops.OpOverload) -> int | None:
    """The position of ``op``'s ``dtype`` argument, or None (keyword-only, or no such argument)."""
    for i, arg in enumerate(op._schema.arguments):
        if arg.name == "dtype":
            return None if arg.kwarg_only else i
    return None


def given_dtype(op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The ``dtype`` the call already passes (by position or keyword), or None."""
    index = dtype_position(op)
    if index is not None and index < len(args):
        return args[index]
    return kwargs.get("dtype")


def set_opt_dtype(
    op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], device_type: str
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """``fp32_set_opt_dtype``: the call with ``dtype=torch.float32`` added, or None where the
    wrapper leaves it as it is (a first argument that is not eligible, a ``dtype`` already set).
    """
    if not is_eligible(first_argument(args, kwargs), device_type):
        return None
    if given_dtype(op, args, kwargs) is not None:
        return None
    index = dtype_position(op)
    if index is not None and index < len(args):  # dtype=None given by position
        return (*args[:index], torch.float32, *args[index + 1 :]), kwargs
    return args, {**kwargs, "dtype": torch.float32}


def append_dtype(
    op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any], device_type: str
) -> tuple[torch._ops.OpOverload, str, dict[str, Any]]:
    """``fp32_append_dtype``: the overload it redispatches to, that overload's entry name, and the
    keyword arguments with the ``dtype`` it appends (fp32 for an eligible first argument, else the
    argument's own)."""
    first = first_argument(args, kwargs)
    dtype = torch.float32 if is_eligible(first, device_type) else first.dtype
    redispatch = APPEND_DTYPE_REDISPATCH[entry_name(op._schema.name, op._overloadname)]
    packet, overload = redispatch.split(".")
    target = getattr(getattr(torch.ops.aten, packet), overload)
    return target, redispatch, {**kwargs, "dtype": dtype}


def promote_type(
    op: torch._ops.OpOverload,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    lower: torch.dtype,
    device_type: str,
) -> torch.dtype:
    """``promote_type``: the widest of the Tensor and Tensor[] arguments."""
    current = lower
    schema_args = op._schema.arguments
    values = list(args) + [kwargs[a.name] for a in schema_args[len(args) :] if a.name in kwargs]
    for arg, value in zip(schema_args, values):
        if str(arg.type) not in ("Tensor", "List[Tensor]"):
            continue  # optional tensors are cast but do not vote, as in the C++ overloads
        for t in tensor_leaves(value):
            if not (device_type_of(t) == device_type and t.is_floating_point()):
                continue
            if t.dtype == torch.float64:
                continue
            if current == torch.float32 or t.dtype == torch.float32:
                current = torch.float32
            elif current == lower and t.dtype == lower:
                current = lower
            else:
                raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")
    return current


__all__ = [
    "append_dtype",
    "dtype_position",
    "first_argument",
    "given_dtype",
    "is_eligible",
    "promote_type",
    "set_opt_dtype",
]
