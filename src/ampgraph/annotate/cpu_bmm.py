"""Which of its kernels the CPU's ``bmm``/``baddbmm`` runs, by size and strides.

A batch of two dtypes raises a different error on each path of ``bmm_out_or_baddbmm_``
(``aten/src/ATen/native/LinearAlgebra.cpp``), so the strict checks
(:mod:`ampgraph.annotate.strict`) must take the path the real kernel takes. The result is made
with ``batch2``'s options (``common_checks_baddbmm_bmm``), then:

* an empty result, or an empty contraction, returns before any kernel (no error);
* fewer than 400 multiply-adds per batch item (contraction x rows x columns): the naive
  ``baddbmm_cpu_kernel``, dispatched on ``batch1``'s dtype (``"naive"``);
* else, with MKL, an fp32/fp64 (or complex) result and both batches' items contiguous or
  transposed: MKL's batched gemm, dispatched on the result's dtype (``"gemm"``);
* else one ``addmm`` per batch item (``"split"``).

oneDNN's path is taken only where both batches have one dtype, which raises nothing. An
``F.linear`` without a bias reaches ``bmm`` where ``matmul`` cannot fold its input into a matrix
(``should_fold``: a 3-D or wider input whose leading dimensions do not view as one, under
``no_grad``), so a Linear's error on the CPU depends on its input's strides and size.
``tests/test_cpu_bmm.py`` compares every path with the real kernel.

>>> import torch
>>> bmm_path(torch.empty(2, 3, 4), torch.empty(2, 4, 5, dtype=torch.bfloat16))
'naive'
>>> bmm_path(torch.empty(2, 30, 40), torch.empty(2, 40, 5, dtype=torch.bfloat16))
'split'
"""

from __future__ import annotations

from typing import Literal

import torch

Path = Literal["empty", "naive", "gemm", "split"]

# The batched gemm takes results of these dtypes (not 16-bit floats, not integers).
_GEMM_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def _items_contiguous_or_transposed(t: torch.Tensor) -> bool:
    """``batch_items_contiguous_or_transposed``: a size-1 dimension's stride does not count."""
    size, stride = t.shape, t.stride()
    return bool(
        (stride[2] == 1 and (size[1] == 1 or stride[1] >= size[2]))
        or (stride[1] == 1 and (size[2] == 1 or stride[2] >= size[1]))
    )


def bmm_path(batch1: torch.Tensor, batch2: torch.Tensor) -> Path:
    """The path CPU ``bmm(batch1, batch2)`` (and ``baddbmm``'s product) takes.

    >>> import torch
    >>> bmm_path(torch.empty(2, 8, 8, dtype=torch.float16), torch.empty(2, 8, 8))
    'gemm'
    """
    bs, rows, contraction = batch1.shape
    cols = batch2.shape[2]
    if bs * rows * cols == 0 or contraction == 0:
        return "empty"
    if contraction * rows * cols < 400:
        return "naive"
    if (
        torch.backends.mkl.is_available()
        and batch2.dtype in _GEMM_DTYPES  # the result's dtype
        and _items_contiguous_or_transposed(batch1)
        and _items_contiguous_or_transposed(batch2)
    ):
        return "gemm"
    return "split"


__all__ = ["Path", "bmm_path"]
