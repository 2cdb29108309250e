"""Mixed-dtype checks that CUDA's own kernels make and fake CUDA tensors skip.

A real GPU showed each (an H100, torch 2.11.0+cu130: ``docs/verification/cuda-survey.json``,
``record["ops"]["parting"]``, kind ``lenient``: the real kernel raises where fake tensors gave a
result); the messages are the real kernels', and the rules are read from ATen's CUDA sources:

* ``bmm`` (``cuda/Blas.cpp``, ``baddbmm_out_cuda_impl``): dispatched on ``batch1``'s type, it reads
  ``batch2`` as that type (``expected scalar type BFloat16 but found Float``). ``einsum`` and 3-D
  ``matmul`` reach it. torch 2.13's meta kernel checks the pair too, with another wording.
* ``linalg_cross`` (``cross``): a ``TensorIterator`` of one dtype, whose output is made like the
  input (``Found dtype Float but expected BFloat16``).
* ``_softmax_backward_data`` and ``_log_softmax_backward_data`` (``cuda/SoftMax.cu``): a
  ``grad_output`` of another dtype than ``input_dtype`` is taken only as fp32 beside fp16, else
  ``expected input and grad types to match, or input to be at::Half and grad to be at::Float``;
  then ``output`` is read as the type the kernel computes in.
* ``grid_sampler_2d``/``_3d`` (``cuda/GridSampler.cu``): the grid is read as the input's type;
  ``cudnn_grid_sampler`` (``cudnn/GridSampler.cpp``, which ``grid_sampler`` picks for a 4-D fp16,
  fp32 or fp64 input, bilinear, zero padding, ``align_corners``) checks the two share one type.
* ``nll_loss_forward``/``nll_loss2d_forward`` (``cuda/Loss.cu``, ``cuda/NLLLoss2d.cu``): the weight
  is read as the input's type.
* ``_cdist_forward`` (``cuda/DistanceKernel.cu``): dispatched on ``x1``'s type (with no bf16 or
  fp16 kernel: the coverage table's rule, :mod:`ampgraph.annotate.device_kernels`), it reads
  ``x2`` as that type. The matrix-product path for p=2 is not this kernel.

>>> import torch
>>> a, b = torch.empty(2, 3, 4, dtype=torch.bfloat16), torch.empty(2, 4, 5)
>>> CUDA_CHECKS[("cuda", torch.ops.aten.bmm.default)]((a, b))
'expected scalar type BFloat16 but found Float'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ampgraph.annotate.device_kernels import _euclidean_cdist, _same_type
from ampgraph.annotate.kernel_dtypes import _NAMES, _read_as

aten = torch.ops.aten

Check = Callable[[tuple[Any, ...]], str | None]

_LOW = (torch.bfloat16, torch.float16)


def _name(dtype: torch.dtype) -> str:
    return _NAMES.get(dtype, str(dtype))


def _tensor(v: Any) -> torch.Tensor | None:
    return v if isinstance(v, torch.Tensor) else None


def _second_as_first(args: tuple[Any, ...]) -> str | None:
    """Kernels dispatched on their first tensor's type that read the second as it: ``bmm``
    (batch1, batch2), ``grid_sampler_2d``/``_3d`` (input, grid)."""
    return _read_as(args[0].dtype, args[1])


def _cross(args: tuple[Any, ...]) -> str | None:
    """``linalg_cross``: ``TensorIterator``'s one-dtype check names the other input beside the
    output, which is made like the input."""
    x, other = args[:2]
    if other.dtype != x.dtype:
        return f"Found dtype {_name(other.dtype)} but expected {_name(x.dtype)}"
    return None


def _softmax_backward(args: tuple[Any, ...]) -> str | None:
    """``softmax_backward_cuda_out``/``log_softmax_backward_cuda_out``: ``half_to_float`` where
    ``grad_output``'s type is not ``input_dtype``, allowed only for an fp32 gradient of an fp16
    input; ``host_softmax_backward`` then reads ``output`` as ``input_dtype`` (half_to_float) or
    as the gradient's type."""
    grad, output, _dim, input_dtype = args[:4]
    half_to_float = grad.dtype != input_dtype
    if half_to_float and not (grad.dtype == torch.float32 and input_dtype == torch.float16):
        return (
            "expected input and grad types to match, or input to be at::Half and grad to be "
            "at::Float"
        )
    return _read_as(input_dtype if half_to_float else grad.dtype, output)


def _cudnn_grid_sampler(args: tuple[Any, ...]) -> str | None:
    """``cudnn_grid_sampler``: ``checkSameType`` of the input and the grid."""
    x, grid = args[:2]
    if x.dtype != grid.dtype:
        where = "(while checking arguments for cudnn_grid_sampler)"
        return _same_type(("input", 1, x), ("grid", 2, grid), where)
    return None


def _nll_loss(args: tuple[Any, ...]) -> str | None:
    """CUDA ``nll_loss_forward``/``nll_loss2d_forward``: the weight is read as the input's type."""
    weight = _tensor(args[2]) if len(args) > 2 else None
    return _read_as(args[0].dtype, weight)


def _cdist(args: tuple[Any, ...]) -> str | None:
    """CUDA ``_cdist_forward``: where the kernel runs (not p=2 by matrix products) and has
    ``x1``'s type (the coverage rule raises for a 16-bit one), ``x2`` is read as it."""
    x1, x2 = args[:2]
    if _euclidean_cdist(args) or x1.dtype in _LOW:
        return None
    return _read_as(x1.dtype, x2)


#: (device type, op) -> a check that returns the real CUDA kernel's error message, or None.
CUDA_CHECKS: dict[tuple[str, Any], Check] = {
    ("cuda", aten.bmm.default): _second_as_first,
    ("cuda", aten.linalg_cross.default): _cross,
    ("cuda", aten._softmax_backward_data.default): _softmax_backward,
    ("cuda", aten._log_softmax_backward_data.default): _softmax_backward,
    ("cuda", aten.grid_sampler_2d.default): _second_as_first,
    ("cuda", aten.grid_sampler_3d.default): _second_as_first,
    ("cuda", aten.cudnn_grid_sampler.default): _cudnn_grid_sampler,
    ("cuda", aten.nll_loss_forward.default): _nll_loss,
    ("cuda", aten.nll_loss2d_forward.default): _nll_loss,
    ("cuda", aten._cdist_forward.default): _cdist,
}

__all__ = ["CUDA_CHECKS"]
