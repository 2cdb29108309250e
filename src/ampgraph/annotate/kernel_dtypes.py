"""The output dtypes where fake (meta) kernels and the real CPU kernels part: mixed normalisations
and the softmax backwards; and the backward normalisations' dtype errors.

Fed a 16-bit input with fp32 parameters ("mixed type", ``aten/src/ATen/native/mixed_dtypes.h``),
the CPU's normalisation kernels return their statistics (mean, rstd, ...) in fp32, and the group
norm's backward returns the input's gradient in the input's dtype. The fake kernels return the
input's dtype for the statistics and fp32 for that gradient. Every replay on fake CPU tensors
(the annotator, the dispatcher oracle, the joint trace of a training step) gives these ops the
real kernels' dtypes; ``tests/test_kernel_dtypes.py`` reads each one off the real kernels, for
every 16-bit input dtype and every parameter dtype, mixed or not.

>>> import torch
>>> x, w = torch.empty(4, 8, dtype=torch.bfloat16), torch.empty(8)
>>> real_cpu_dtypes(torch.ops.aten.native_layer_norm.default, (x, [8], w, w, 1e-5))
{1: torch.float32, 2: torch.float32}
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
STATISTICS, INPUT = "statistics", "input"

#: op -> (index of the input, indices of its parameters): the CPU normalisations that take a
#: 16-bit input with fp32 parameters (``mixed_dtypes.h``). As in ``is_mixed_type``, the first
#: parameter given decides whether the input is mixed. The one table of these indices: the
#: strict checks (:mod:`ampgraph.annotate.strict`) read them too.
CPU_NORM_PARAMS: dict[Any, tuple[int, tuple[int, ...]]] = {
    aten.native_layer_norm.default: (0, (2, 3)),
    aten.native_group_norm.default: (0, (1, 2)),
    aten.native_batch_norm.default: (0, (1, 2, 3, 4)),
    aten._native_batch_norm_legit.default: (0, (1, 2, 3, 4)),
    aten._native_batch_norm_legit.no_stats: (0, (1, 2)),
    aten._native_batch_norm_legit_no_training.default: (0, (1, 2, 3, 4)),
    aten._native_batch_norm_legit_functional.default: (0, (1, 2, 3, 4)),
    aten._batch_norm_with_update.default: (0, (1, 2, 3, 4)),
    aten._batch_norm_no_update.default: (0, (1, 2, 3, 4)),
    aten.native_group_norm_backward.default: (1, (2, 3, 4)),
}

#: op -> the outputs the fake kernel mistypes, and what the real kernel gives them: fp32
#: statistics (mean and rstd, outputs 1 and 2), or for the group norm's backward the input's
#: gradient (output 0) in the input's dtype.
_MISTYPED: dict[Any, tuple[tuple[int, ...], str]] = {
    op: ((1, 2), STATISTICS) for op in CPU_NORM_PARAMS
} | {aten.native_group_norm_backward.default: ((0,), INPUT)}

#: op -> (index of the input, indices of its parameters, outputs the fake kernel mistypes, and
#: what the real kernel gives them).
CPU_MIXED: dict[Any, tuple[int, tuple[int, ...], tuple[int, ...], str]] = {
    op: (*CPU_NORM_PARAMS[op], *_MISTYPED[op]) for op in CPU_NORM_PARAMS
}


# -- the backward normalisations' dtype errors (CPU), registered by ampgraph.annotate.strict ----
_NAMES = {torch.float32: "Float", torch.bfloat16: "BFloat16", torch.float16: "Half",
          torch.float64: "Double"}  # fmt: skip
_MIXED_NOT_FLOAT = "mixed dtype (CPU): expect parameter to have scalar type of Float"
_LOW = (torch.bfloat16, torch.float16)


def _read_as(dtype: torch.dtype, *tensors: Any) -> str | None:
    """``data_ptr<scalar_t>()`` of each tensor given, read as ``dtype``: the first that is not."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dtype != dtype:
            found = _NAMES.get(t.dtype, str(t.dtype))
            return f"expected scalar type {_NAMES.get(dtype, str(dtype))} but found {found}"
    return None


def _layer_norm_backward(args: tuple[Any, ...]) -> str | None:
    """``native_layer_norm_backward``: the gradient is read as the input's type; the statistics
    as fp32 where the input is 16-bit with fp32 parameters (mixed), as the input's type
    otherwise, and then, outside that mixed case, the parameters."""
    grad, x, _shape, mean, rstd, weight, bias = args[:7]
    params = [t for t in (weight, bias) if isinstance(t, torch.Tensor)]
    mixed = bool(params) and x.dtype in _LOW and params[0].dtype == torch.float32
    if mixed:
        return _read_as(x.dtype, grad) or _read_as(torch.float32, mean, rstd)
    return _read_as(x.dtype, grad, mean, rstd, *params)


def _group_norm_backward(args: tuple[Any, ...]) -> str | None:
    """``native_group_norm_backward``: X and dY first; statistics of another dtype than X make
    it mixed, and must then be fp32 (as gamma is read); otherwise gamma is read as X's type."""
    dy, x, mean, rstd, gamma = args[:5]
    if dy.dtype != x.dtype:
        return "Expected scalar types of X and dY are same."
    if mean.dtype != x.dtype:
        if mean.dtype != torch.float32 or rstd.dtype != torch.float32:
            return _MIXED_NOT_FLOAT
        return _read_as(torch.float32, gamma)
    return _read_as(x.dtype, rstd, gamma)


def _batch_norm_backward(args: tuple[Any, ...]) -> str | None:
    """``native_batch_norm_backward``: the first parameter given decides whether the input is
    mixed (``is_mixed_type``), when every parameter must be fp32; then the gradient is read as
    the input's type, and outside the mixed case the saved, then the running statistics."""
    grad, x, weight, running_mean, running_var, save_mean, save_invstd = args[:7]
    given = [t for t in (weight, running_mean, running_var, save_mean, save_invstd)
             if isinstance(t, torch.Tensor)]  # fmt: skip
    if given and given[0].dtype != x.dtype:
        if any(t.dtype != torch.float32 for t in given):
            return _MIXED_NOT_FLOAT
        if x.dtype not in _LOW:
            return "mixed dtype (CPU): all inputs must share same datatype."
        return _read_as(x.dtype, grad)
    return _read_as(x.dtype, grad, save_mean, save_invstd, running_mean, running_var, weight)


#: op -> the CPU kernel's dtype error for these args, or None (``StrictDtypeMode`` raises it).
CPU_NORM_BACKWARD_CHECKS = {
    aten.native_layer_norm_backward.default: _layer_norm_backward,
    aten.native_group_norm_backward.default: _group_norm_backward,
    aten.native_batch_norm_backward.default: _batch_norm_backward,
}


def _softmax_backward(args: tuple[Any, ...]) -> dict[int, torch.dtype] | None:
    """CPU ``_softmax_backward_data``/``_log_softmax_backward_data`` return ``grad_output``'s
    dtype whatever ``input_dtype`` says (the decomposition fake tensors run casts to it; its own
    comment: "CPU kernel doesn't respect input_dtype"). The one pair the kernel refuses (fp32
    grad, fp16 ``input_dtype``) is a strict check."""
    grad = args[0]
    if isinstance(grad, torch.Tensor) and grad.device.type == "cpu" and args[3] != grad.dtype:
        return {0: grad.dtype}
    return None


#: op -> the rule giving the real CPU kernel's output dtypes where the fake kernel's part.
CPU_RULES = {
    aten._softmax_backward_data.default: _softmax_backward,
    aten._log_softmax_backward_data.default: _softmax_backward,
}


def real_cpu_dtypes(func: Any, args: tuple[Any, ...]) -> dict[int, torch.dtype] | None:
    """``{output index: dtype}`` where the real CPU kernel of ``func`` types an output otherwise
    than the fake kernel does for these ``args``; None where they agree."""
    rule = CPU_RULES.get(func)
    if rule is not None:
        return rule(args)
    entry = CPU_MIXED.get(func)
    if entry is None:
        return None
    x_index, params, outputs, kind = entry
    x = args[x_index] if len(args) > x_index else None
    w = next((args[i] for i in params if i < len(args) and isinstance(args[i], torch.Tensor)),
             None)  # fmt: skip
    mixed = (
        isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)
        and x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16)
        and w.dtype == torch.float32
    )  # fmt: skip
    if not mixed:
        return None
    dtype = torch.float32 if kind == STATISTICS else x.dtype
    return dict.fromkeys(outputs, dtype)


def retyped(out: Any, dtypes: dict[int, torch.dtype]) -> tuple[Any, ...]:
    """``out`` with each output in ``dtypes`` replaced by an empty tensor of that dtype (same
    shape and strides, made by whichever fake mode is below the caller)."""
    fixed = list(out)
    for i, dtype in dtypes.items():
        t = fixed[i]
        if isinstance(t, torch.Tensor) and t.dtype != dtype:
            fixed[i] = t.new_empty_strided(t.shape, t.stride(), dtype=dtype)
    return tuple(fixed)


class RealCpuDtypes(TorchDispatchMode):
    """Give the ops of :data:`CPU_MIXED` the real CPU kernels' output dtypes on fake tensors."""

    #: A higher-order op (``flex_attention``) passes through whole (none is in CPU_MIXED).
    supports_higher_order_operators = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        dtypes = real_cpu_dtypes(func, tuple(args))
        if dtypes is None:
            return out
        if isinstance(out, torch.Tensor):  # a softmax backward: one output
            return self.retype((out,), dtypes)[0]
        return self.retype(out, dtypes)

    def retype(self, out: Any, dtypes: dict[int, torch.dtype]) -> tuple[Any, ...]:
        """``out`` with the real kernel's ``dtypes`` (a tracer also moves its graph's values)."""
        return retyped(out, dtypes)


__all__ = [
    "CPU_MIXED",
    "CPU_NORM_BACKWARD_CHECKS",
    "CPU_NORM_PARAMS",
    "CPU_RULES",
    "RealCpuDtypes",
    "real_cpu_dtypes",
    "retyped",
]
