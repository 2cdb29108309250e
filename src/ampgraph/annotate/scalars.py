"""Python scalars the real kernels convert to a tensor's dtype, and refuse where they overflow it.

Many kernels take a Python number and convert it with ``Scalar::to<scalar_t>()``, which is
``c10::checked_convert`` (``c10/util/TypeCast.h``): a finite value outside the destination type's
range raises ``value cannot be converted to type c10::BFloat16 without overflow``. Fake kernels
never convert the value, so they run. The common case is attention code that pads or fills a
16-bit mask with ``torch.finfo(torch.float32).min``: about -3.4028e38, below bf16's lowest
(-3.3895e38) as well as fp16's (-65504). Infinities and NaN convert to the floating types; an
integer type takes no NaN nor infinity, and an unsigned one takes a negative Python int (it
wraps) but not a negative float.

:data:`SCALAR_CHECKS` joins :data:`ampgraph.annotate.strict.STRICT_CHECKS`, so the annotation,
the dispatcher check and ``verify``'s fake oracle raise where the real kernel does. The ops whose
value reaches ``fill_`` (``constant_pad_nd``, ``fill``, ``full``, ``full_like``, ``new_full``)
and ``masked_fill`` convert it in their CUDA kernels too (``cuda/Fill.cu``, ``IndexKernel.cu``),
so they hold on both devices; the others are proven on the CPU only
(``tests/test_scalar_overflow.py``: each op, each dtype, against the real CPU kernel). Some CPU
kernels convert to their op-math type instead (fp32 for a 16-bit tensor: ``leaky_relu``'s slope).

>>> import torch
>>> check = SCALAR_CHECKS[("cpu", torch.ops.aten.constant_pad_nd.default)]
>>> check((torch.empty(2, dtype=torch.bfloat16), [1, 1], torch.finfo(torch.float32).min))
'value cannot be converted to type c10::BFloat16 without overflow'
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

Check = Callable[[tuple[Any, ...]], str | None]

#: The C++ type each dtype converts to, as the message names it (``c10::demangle_type``).
C10_TYPES: dict[torch.dtype, str] = {
    torch.bfloat16: "c10::BFloat16", torch.float16: "c10::Half", torch.float32: "float",
    torch.float64: "double", torch.int8: "int8_t", torch.uint8: "uint8_t",
    torch.int16: "int16_t", torch.int32: "int", torch.int64: "int64_t",
}  # fmt: skip


def overflows(value: Any, dtype: torch.dtype) -> bool:
    """``c10::overflows<To, From>``: whether a Python ``value`` overflows ``dtype``.

    >>> lowest = torch.finfo(torch.float32).min
    >>> overflows(lowest, torch.bfloat16), overflows(float("-inf"), torch.half)
    (True, False)
    """
    if dtype not in C10_TYPES or isinstance(value, bool) or not isinstance(value, (int, float)):
        return False  # a bool converts to anything; other types (complex, SymInt) not modelled
    if dtype.is_floating_point:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        info = torch.finfo(dtype)
        return value < info.min or value > info.max
    limits = torch.iinfo(dtype)
    if isinstance(value, float):
        return math.isnan(value) or value < limits.min or value > limits.max
    if limits.min == 0 and value < 0:  # a negative int wraps into an unsigned type
        return -value > limits.max
    return value < limits.min or value > limits.max


def _message(dtype: torch.dtype) -> str:
    return f"value cannot be converted to type {C10_TYPES[dtype]} without overflow"


def _first_overflow(values: list[Any], dtype: torch.dtype) -> str | None:
    return _message(dtype) if any(overflows(v, dtype) for v in values) else None


def _opmath(dtype: torch.dtype) -> torch.dtype:
    """The type CPU kernels compute a 16-bit tensor in (``at::opmath_type``)."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _kwargs(args: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The positionals and the keyword-only arguments (given last, as a dict, by the strict
    mode for the ops of :data:`KEYWORD_CHECKED`)."""
    if args and isinstance(args[-1], dict):
        return args[:-1], args[-1]
    return args, {}


def _on_self(*indices: int, opmath: bool = False, only_16bit: bool = False) -> Check:
    """The scalars at ``indices`` convert to the first argument's dtype (or its op-math type);
    ``only_16bit``: for a 16-bit tensor only (CPU ``pow`` takes an fp32 tensor's exponent as a
    double)."""

    def check(args: tuple[Any, ...]) -> str | None:
        args, _ = _kwargs(args)
        self = args[0]
        if not isinstance(self, torch.Tensor):
            return None
        if only_16bit and self.dtype not in (torch.bfloat16, torch.float16):
            return None
        dtype = _opmath(self.dtype) if opmath else self.dtype
        return _first_overflow([args[i] for i in indices if i < len(args)], dtype)

    return check


def _threshold(args: tuple[Any, ...]) -> str | None:
    """CPU ``threshold(self, threshold, value)``: the threshold to the op-math type first, then
    the value to the tensor's dtype."""
    return _on_self(1, opmath=True)(args) or _on_self(2)(args)


def _factory(index: int, like: int | None = None) -> Check:
    """A factory filled with the scalar at ``index``: its ``dtype=``, else the dtype of the
    tensor at ``like`` (``full_like``, ``new_full``), else the type of the value (a float takes
    the default dtype)."""

    def check(args: tuple[Any, ...]) -> str | None:
        args, kwargs = _kwargs(args)
        dtype = kwargs.get("dtype")
        if dtype is None and like is not None and isinstance(args[like], torch.Tensor):
            dtype = args[like].dtype
        value = args[index] if index < len(args) else None
        if dtype is None:
            dtype = torch.get_default_dtype() if isinstance(value, float) else torch.int64
        return _first_overflow([value], dtype)

    return check


def _linspace(args: tuple[Any, ...]) -> str | None:
    """``linspace(start, end, steps, dtype=)``: both ends convert to the result's dtype."""
    args, kwargs = _kwargs(args)
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    return _first_overflow([a for a in args[:2] if not isinstance(a, torch.Tensor)], dtype)


def _keyword(name: str, opmath: bool = False) -> Check:
    """A keyword-only scalar converted to the result's dtype of the first two tensors (CPU
    ``add``/``sub``'s ``alpha=``), or to its op-math type (``addcmul``'s ``value=``)."""

    def check(args: tuple[Any, ...]) -> str | None:
        args, kwargs = _kwargs(args)
        if name not in kwargs or not all(isinstance(a, torch.Tensor) for a in args[:2]):
            return None
        dtype = torch.result_type(args[0], args[1])
        return _first_overflow([kwargs[name]], _opmath(dtype) if opmath else dtype)

    return check


def _both(ops: dict[Any, Check]) -> dict[tuple[str, Any], Check]:
    return {(device, op): check for op, check in ops.items() for device in ("cpu", "cuda")}


#: Ops whose value reaches ``fill_`` or ``masked_fill``'s kernel, on every device.
_EVERY_DEVICE: dict[Any, Check] = {
    aten.constant_pad_nd.default: _on_self(2),
    aten.fill.Scalar: _on_self(1),
    aten.fill_.Scalar: _on_self(1),
    aten.full.default: _factory(1),
    aten.full_like.default: _factory(1, like=0),
    aten.new_full.default: _factory(2, like=0),
    aten.masked_fill.Scalar: _on_self(2),
    aten.masked_fill_.Scalar: _on_self(2),
}

#: Ops whose CPU kernels convert their scalars (proven on the CPU; their CUDA kernels are not
#: all alike: some convert to the op-math type, which a 16-bit value never overflows).
_CPU: dict[Any, Check] = {
    aten.index_fill.int_Scalar: _on_self(3),
    aten.index_fill_.int_Scalar: _on_self(3),
    aten.scatter.value: _on_self(3),
    aten.scatter_.value: _on_self(3),
    aten.clamp.default: _on_self(1, 2),
    aten.clamp_.default: _on_self(1, 2),
    aten.clamp_min.default: _on_self(1),
    aten.clamp_min_.default: _on_self(1),
    aten.clamp_max.default: _on_self(1),
    aten.clamp_max_.default: _on_self(1),
    aten.threshold.default: _threshold,
    aten.threshold_.default: _threshold,
    aten.hardtanh.default: _on_self(1, 2),
    aten.hardtanh_.default: _on_self(1, 2),
    aten.hardshrink.default: _on_self(1),
    aten.pow.Tensor_Scalar: _on_self(1, only_16bit=True),
    aten.add.Tensor: _keyword("alpha"),
    aten.sub.Tensor: _keyword("alpha"),
    aten.addcmul.default: _keyword("value", opmath=True),
    aten.addcdiv.default: _keyword("value", opmath=True),
    aten.linspace.default: _linspace,
    aten.leaky_relu.default: _on_self(1, opmath=True),
    aten.leaky_relu_.default: _on_self(1, opmath=True),
    aten.softplus.default: _on_self(1, 2, opmath=True),
    aten.celu.default: _on_self(1, opmath=True),
    aten.elu.default: _on_self(1, 2, 3, opmath=True),
}

#: (device type, op) -> the real kernel's overflow error for these args, or None.
SCALAR_CHECKS: dict[tuple[str, Any], Check] = {
    **_both(_EVERY_DEVICE),
    **{("cpu", op): check for op, check in _CPU.items()},
}

#: Ops whose checks read keyword-only arguments (``dtype=``, ``alpha=``).
KEYWORD_CHECKED = frozenset({
    aten.full.default, aten.full_like.default, aten.new_full.default, aten.linspace.default,
    aten.add.Tensor, aten.sub.Tensor, aten.addcmul.default, aten.addcdiv.default,
})  # fmt: skip

__all__ = ["C10_TYPES", "KEYWORD_CHECKED", "SCALAR_CHECKS", "overflows"]
