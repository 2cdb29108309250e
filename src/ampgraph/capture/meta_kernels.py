"""Meta kernels stricter than the real kernels they stand for, or typing otherwise, replaced.

A fake tensor computes dtypes with the op's meta kernel. Where that kernel refuses a dtype the real
kernel accepts, a trace or the eager-hook oracle reports an error a real run never raises, and
everything after it is lost. Each replacement here keeps the meta kernel's shapes and strides and
takes its dtype rules from the real kernel's source, and is proved against the real CPU kernel,
which shares the rule (``tests/test_meta_kernels.py``):

* ``aten::_grouped_mm`` (``torch.nn.functional.grouped_mm``; transformers' MoE experts from 5.0
  on a GPU of compute capability 8.0 or newer): the meta kernel of torch 2.14 takes bf16 only, and
  fp16 only with cuBLASLt 13.3 on an sm_90+ GPU it can query. The real CUDA and CPU kernels
  (``aten/src/ATen/native/GroupedMMUtils.h``: ``_grouped_mm_validate_inputs``, then the bf16 fast
  path or ``_grouped_mm_fallback``'s loop of ``mm_out``) take fp32, bf16 and fp16, return
  ``mat_a``'s dtype, and raise ``mm``'s error where the two dtypes differ.
* ``addr``, ``huber_loss``, ``soft_margin_loss``, ``threshold_backward``, ``mse_loss_backward``,
  ``binary_cross_entropy_with_logits`` and ``addmv`` (before torch 2.12):
  fake tensors ran Python decompositions that promote otherwise than the real kernels (found by
  ``scripts/fake_kernel_survey.py``, ``docs/fake-kernels.md``); each replacement keeps the
  decomposition's shape and takes the dtype the real kernels' shared code gives.

>>> import torch
>>> from ampgraph.capture.environment import analysis_environment
>>> from ampgraph.torchutil import fake_mode
>>> with analysis_environment(), fake_mode():
...     a, b = torch.empty(8, 16, device="cuda"), torch.empty(4, 16, 32, device="cuda")
...     torch._grouped_mm(a, b, offs=torch.tensor([2, 4, 6, 8], dtype=torch.int32, device="cuda")).dtype
torch.float32
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ampgraph.compat import (
    addmv_meta_checks_dtypes,
    layer_norm_backward_meta_is_right,
    mse_loss_backward_takes_mixed_dtypes,
)
from ampgraph.capture.scoped_library import ScopedLibrary

#: The dtypes ``_grouped_mm_validate_inputs`` accepts for either matrix.
GROUPED_MM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

#: How c10 prints a dtype in ``mm``'s message (``float != c10::BFloat16``) and in a ScalarType.
_SCALAR_NAMES = {
    torch.float32: "float",
    torch.bfloat16: "c10::BFloat16",
    torch.float16: "c10::Half",
}
_TYPE_NAMES = {torch.float64: "Double", torch.int64: "Long", torch.int32: "Int", torch.int8: "Char",
               torch.uint8: "Byte", torch.bool: "Bool"}  # fmt: skip


def _scalar(dtype: torch.dtype) -> str:
    return _SCALAR_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def _grouped_mm(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``_grouped_mm`` as the real kernels type it; the meta kernel's output layout."""
    from torch._meta_registrations import meta_grouped_mm

    for name, mat in (("mat_a", mat_a), ("mat_b", mat_b)):
        if mat.dtype not in GROUPED_MM_DTYPES:
            raise RuntimeError(
                f"Expected {name} to be Float32, BFloat16 or Float16 matrix, got "
                f"{_TYPE_NAMES.get(mat.dtype, str(mat.dtype).removeprefix('torch.'))}"
            )
    if (out_dtype or mat_a.dtype) != mat_a.dtype:
        raise RuntimeError("Grouped gemm output dtype must match `mat_a` dtype")
    if mat_a.dtype != mat_b.dtype:  # the fallback's mm_out, and the fast path takes bf16 only
        raise RuntimeError(
            "expected m1 and m2 to have the same dtype, but got: "
            f"{_scalar(mat_a.dtype)} != {_scalar(mat_b.dtype)}"
        )
    # The 16-byte stride rule counts the operands' own element size: an fp32 row of 12 is 48
    # bytes, which the real CPU kernel takes and a bf16 stand-in's 24 would not be.
    _check_strides("mat_a", mat_a)
    _check_strides("mat_b", mat_b)
    # Shapes and offsets as the meta kernel checks and lays them out, on bf16 stand-ins (its
    # dtype rule takes bf16 only), laid out as the operands are and aligned.
    a, b = _aligned_bf16(mat_a), _aligned_bf16(mat_b)
    out = meta_grouped_mm(a, b, offs, bias, None)
    return torch.empty_strided(out.shape, out.stride(), dtype=mat_a.dtype, device=out.device)


def _check_strides(name: str, mat: torch.Tensor) -> None:
    """torch's 16-byte rule for a ``_grouped_mm`` operand's leading stride (``check_valid_strides``
    of ``torch/_meta_registrations.py``), in the operand's own element size."""
    stride, end = mat.stride(), mat.dim() - 1
    alignment = max(1, 16 // mat.element_size())
    if stride[end - 1] == 1 and stride[end] >= max(1, mat.shape[end - 1]):
        dim = end
    elif stride[end] == 1 and stride[end - 1] >= max(1, mat.shape[end]):
        dim = end - 1
    else:
        raise RuntimeError(
            f"Invalid strides/sizes, got {stride} for strides and {mat.shape} for sizes."
        )
    if stride[dim] % alignment:
        raise RuntimeError(
            f"Expected {name} stride along {dim} dim to be multiple of 16 bytes, got {stride[dim]}."
        )


def _aligned_bf16(mat: torch.Tensor) -> torch.Tensor:
    """A bf16 tensor of ``mat``'s shape, its last two dimensions in ``mat``'s order, each
    matrix's leading stride rounded up to 8 elements (16 bytes)."""
    transposed = mat.dim() >= 2 and mat.stride(-1) != 1
    shape = list(mat.shape)
    if transposed:
        shape[-1], shape[-2] = shape[-2], shape[-1]
    rows, cols = shape[-2], shape[-1]
    padded = torch.empty((*shape[:-1], -(-max(cols, 1) // 8) * 8), dtype=torch.bfloat16,
                         device=mat.device)[..., :cols]  # fmt: skip
    return padded.transpose(-1, -2) if transposed else padded


def _retyped(out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``out``'s shape and strides in ``dtype``."""
    if out.dtype == dtype:
        return out
    return torch.empty_strided(out.shape, out.stride(), dtype=dtype, device=out.device)


def _addr(
    self: torch.Tensor,
    vec1: torch.Tensor,
    vec2: torch.Tensor,
    *,
    beta: Any = 1,
    alpha: Any = 1,
) -> torch.Tensor:
    """``addr`` as the real kernels type it: ``build_addr_iter`` expands ``self`` to the outer
    product's shape before the ``TensorIterator`` promotes, so a 0-dim fp32 ``self`` with bf16
    vectors gives fp32 (the reference, ``torch._refs.addr``, treats it as a scalar: bf16). Its
    checks are the reference's."""
    for name, vec in (("vec1", vec1), ("vec2", vec2)):
        torch._check(
            vec.dim() == 1, lambda name=name, vec=vec: f"addr: Expected 1-D argument {name}, "
            f"but got {vec.dim()}-D"
        )  # fmt: skip
    for name, arg in (("alpha", alpha), ("beta", beta)):
        if isinstance(arg, bool):
            torch._check(
                all(t.dtype == torch.bool for t in (self, vec1, vec2)),
                lambda name=name: f"Boolean {name} only supported for Boolean results.",
            )
    shape = (vec1.shape[0], vec2.shape[0])
    torch._check(
        torch.broadcast_shapes(self.shape, shape) == torch.Size(shape),
        lambda: (
            f"The expanded size of the tensor must match the existing size: {list(shape)} "
            f"against {list(self.shape)}"
        ),
    )
    dtype = torch.promote_types(torch.promote_types(self.dtype, vec1.dtype), vec2.dtype)
    return vec1.new_empty(shape, dtype=dtype)


def _loss_as_input(name: str) -> Any:
    """A loss whose real kernel writes into a tensor made like ``input`` (``Loss.cpp``:
    ``huber_loss``'s ``at::empty_like(input)``, ``soft_margin_loss``'s ``input.options()``):
    the input's dtype, where the reference promotes with the target."""
    from torch._decomp import decomposition_table

    reference = decomposition_table[getattr(torch.ops.aten, name).default]

    def kernel(input: torch.Tensor, target: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return _retyped(reference(input, target, *args, **kwargs), input.dtype)

    kernel.__name__ = kernel.__qualname__ = f"_{name}"
    return kernel


def _bce_with_logits(input: torch.Tensor, target: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """``binary_cross_entropy_with_logits`` (``Loss.cpp``, every device) computes
    ``(1 - target).mul_(input)...`` in place: the target's dtype, where torch 2.10 and 2.11's
    reference promotes with the input (an H100 on 2.11: ``(f32[5], bf16[5]) -> bf16``)."""
    from torch._decomp import decomposition_table

    reference = decomposition_table[torch.ops.aten.binary_cross_entropy_with_logits.default]
    return _retyped(reference(input, target, *args, **kwargs), target.dtype)


def _addmv_before_2_12(
    self: torch.Tensor, mat: torch.Tensor, vec: torch.Tensor, *, beta: Any = 1, alpha: Any = 1
) -> torch.Tensor:
    """``addmv`` before torch 2.12: ``TORCH_META_FUNC(addmv)`` makes the result with ``vec``'s
    options and checks no dtype (the kernels copy ``self`` into it, casting), where the reference
    fake tensors ran promotes with ``self`` (2.11's real CPU kernel: ``addmv(f32[5], bf16[5, 10],
    bf16[10])`` is bf16). From 2.12 on the meta function refuses any mix."""
    torch._check(
        mat.dim() == 2 and vec.dim() == 1 and self.dim() <= 1,
        lambda: f"vector + matrix @ vector expected, got {self.dim()}, {mat.dim()}, {vec.dim()}",
    )
    torch._check(
        mat.shape[1] == vec.shape[0] and self.numel() in (mat.shape[0], 1),
        lambda: (
            f"size mismatch, got input ({self.shape[0] if self.dim() else 1}), mat "
            f"({mat.shape[0]}x{mat.shape[1]}), vec ({vec.shape[0]})"
        ),
    )
    return vec.new_empty((mat.shape[0],))


def _threshold_backward(grad: torch.Tensor, self: torch.Tensor, threshold: Any) -> torch.Tensor:
    """``threshold_backward`` (ReLU's backward): its structured meta function builds a binary
    ``TensorIterator`` of ``self`` and the gradient, which promotes; the decomposition fake
    tensors ran returns the gradient's dtype."""
    shape = torch.broadcast_shapes(grad.shape, self.shape)
    return grad.new_empty(shape, dtype=torch.promote_types(grad.dtype, self.dtype))


def _mse_loss_backward(
    grad: torch.Tensor, input: torch.Tensor, target: torch.Tensor, reduction: int
) -> torch.Tensor:
    """``mse_loss_backward`` (``Loss.cpp``, every device) writes into ``at::zeros_like(input)``
    (contiguous): the input's dtype, where the decomposition promotes with the target. Before
    torch 2.12 the kernel takes no other dtype beside the input's
    (:func:`ampgraph.compat.mse_loss_backward_takes_mixed_dtypes`)."""
    torch.broadcast_shapes(grad.shape, input.shape, target.shape)  # its shape check
    if not mse_loss_backward_takes_mixed_dtypes():
        for other in (target, grad):
            if other.dtype != input.dtype:
                raise RuntimeError(
                    f"Found dtype {_c10_name(other.dtype)} but expected {_c10_name(input.dtype)}"
                )
    return input.new_empty(input.shape)


def _layer_norm_backward_before_2_10(
    grad_out: torch.Tensor, input: torch.Tensor, normalized_shape: Any, mean: torch.Tensor,
    rstd: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, mask: Any,
) -> tuple[torch.Tensor | None, ...]:  # fmt: skip
    """``native_layer_norm_backward`` (``layer_norm.cpp``, CPU and CUDA alike): ``dgamma`` and
    ``dbeta`` are allocated like ``gamma`` and ``beta`` (``empty_like``), in their dtypes, the
    input's gradient like the input. torch 2.9's meta kernel casts all three to the input's dtype
    (an fp32 LayerNorm after a bf16 Linear: bf16 gradients, where the kernels give fp32;
    :func:`ampgraph.compat.layer_norm_backward_meta_is_right`)."""
    return (
        input.new_empty(input.shape) if mask[0] else None,
        weight.new_empty(weight.shape) if mask[1] and weight is not None else None,
        bias.new_empty(bias.shape) if mask[2] and bias is not None else None,
    )


def _c10_name(dtype: torch.dtype) -> str:
    """A dtype as c10 names a ScalarType (``Float``, ``BFloat16``, ``Half``)."""
    names = {torch.float32: "Float", torch.bfloat16: "BFloat16", torch.float16: "Half"}
    return names.get(dtype) or _TYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


#: Op name -> the replacement meta kernel.
REPLACED: dict[str, Any] = {
    "_grouped_mm": _grouped_mm,
    "addr": _addr,
    "huber_loss": _loss_as_input("huber_loss"),
    "soft_margin_loss": _loss_as_input("soft_margin_loss"),
    "binary_cross_entropy_with_logits": _bce_with_logits,
    **({"addmv": _addmv_before_2_12} if not addmv_meta_checks_dtypes() else {}),
    "threshold_backward": _threshold_backward,
    "mse_loss_backward": _mse_loss_backward,
    **(
        {"native_layer_norm_backward": _layer_norm_backward_before_2_10}
        if not layer_norm_backward_meta_is_right()
        else {}
    ),
}


def install() -> Callable[[], None]:
    """Replace each meta kernel where fake tensors look for it, until the returned function runs:
    the dispatcher's Meta key (a plain fake tensor), the Python kernel that ``register_meta`` also
    filled (what a trace under the Python dispatcher, make_fx's and export's, calls first), and the
    meta table (which a fake tensor prefers to the decomposition it would otherwise run). The
    returned function puts torch's own back (:mod:`ampgraph.capture.environment` calls both)."""
    from torch._C import DispatchKey
    from torch._decomp import meta_table

    lib = ScopedLibrary("aten")  # destroyed by the undo
    missing = object()
    previous: list[tuple[Any, Any, Any]] = []  # (op, its Python Meta kernel, its meta table entry)

    def undo() -> None:
        # Pops this library's registrations, and puts back the Python kernels a fake tensor
        # calls through the dispatcher's map (capture/scoped_library.py): torch's are back.
        lib.destroy()
        for op, py_kernel, entry in previous:
            if py_kernel is not missing:
                op.py_kernels[DispatchKey.Meta] = py_kernel
                op._dispatch_cache.clear()
            if entry is missing:
                meta_table.pop(op, None)
            else:
                meta_table[op] = entry

    try:
        for name, kernel in REPLACED.items():
            if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
                continue
            # Over a Python kernel torch does not give back, refused (AmpgraphError): it would
            # stay ampgraph's for the rest of the process. None is so on torch 2.9 to 2.14.
            lib.impl(name, kernel, "Meta", restorable_only=True)
            op = getattr(torch.ops.aten, name).default
            previous.append((op, op.py_kernels.get(DispatchKey.Meta, missing),
                             meta_table.get(op, missing)))  # fmt: skip
            if DispatchKey.Meta in op.py_kernels:
                op.py_kernels[DispatchKey.Meta] = kernel
                op._dispatch_cache.clear()
            # In the meta table a fake tensor prefers it to a Python decomposition too.
            meta_table[op] = kernel
    except BaseException:
        undo()
        raise
    return undo


__all__ = ["GROUPED_MM_DTYPES", "REPLACED", "install"]
