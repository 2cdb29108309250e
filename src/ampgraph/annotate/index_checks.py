"""The indexing kernels' dtype checks that fake (meta) kernels skip, per device.

``index_put``, ``index_add``, ``index_copy``, ``index_reduce``, ``put`` and ``masked_scatter`` want
the source in the destination's dtype; where PyTorch checks it, and where a path skips the check,
is written here (:data:`INDEX_CHECKS`, merged into :data:`ampgraph.annotate.strict.STRICT_CHECKS`).

``index_put`` takes two paths that never reach ``make_index_put_iterator``, the one place its
dtype check is made (``_index_put_impl_`` in ``TensorAdvancedIndexing.cpp``, torch 2.10 to 2.14):

* **masked fill**, every device: without ``accumulate``, one boolean (or uint8) mask on the
  destination's device and a one-element value on the CPU become ``masked_fill_(mask,
  value.item())``, which takes a value of any dtype (``canDispatchToMaskedFill``);
* **sort**, CUDA only: with ``accumulate`` (or deterministic algorithms and more than one value)
  a CUDA destination goes to ``index_put_with_sort_stub`` (``cuda/Indexing.cu``), whose kernel
  is dispatched on the value's type and reads the destination as it: ``index_put(bf16[5, 5],
  (int64[2],), f32[2, 5], accumulate=True)`` raises ``expected scalar type Float but found
  BFloat16`` on an H100 (torch 2.11, ``docs/verification/cuda-survey-rules.json``), where the
  CPU says ``Index put requires ...``. Where nothing is indexed the kernel is not launched and
  nothing is checked: the H100 returned bf16 for ``index_put(bf16[5, 5], (bool[5],), f32[5],
  accumulate=True)`` because OpInfo's mask there is all false (``docs/verification/
  cuda-survey.json``). A mask's contents are data fake tensors do not have: the rule takes a
  boolean mask to select something, and an empty integer index to select nothing.

>>> import torch
>>> x, v = torch.empty(5, 5, dtype=torch.bfloat16), torch.empty(5)
>>> mask = torch.ones(5, dtype=torch.bool)
>>> INDEX_CHECKS[("cpu", torch.ops.aten.index_put.default)]((x, [mask], v, True))[:41]
'Index put requires the source and destina'
>>> INDEX_CHECKS[("cuda", torch.ops.aten.index_put.default)]((x, [mask], v, True))
'expected scalar type Float but found BFloat16'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ampgraph.torchutil import scalar_type_name as _st

aten = torch.ops.aten

Check = Callable[[tuple[Any, ...]], str | None]


def _masked_fill_path(self: torch.Tensor, indices: Any, value: torch.Tensor) -> bool:
    """``canDispatchToMaskedFill``: a one-element value on the CPU, and exactly one index given,
    a bool or uint8 mask on the destination's device."""
    if value.numel() != 1 or value.device.type != "cpu":
        return False
    given = [i for i in (indices or ()) if isinstance(i, torch.Tensor)]
    return (
        len(given) == 1
        and given[0].dtype in (torch.bool, torch.uint8)
        and (given[0].device == self.device)
    )


def _sort_path(value: torch.Tensor, accumulate: bool) -> bool:
    """CUDA's ``index_put_with_sort_stub``: ``accumulate``, or deterministic algorithms with
    more than one value (older releases took one value there too: the check is kept then)."""
    deterministic = torch.are_deterministic_algorithms_enabled() and value.numel() > 1
    return bool(accumulate) or deterministic


def _sort_kernel(self: torch.Tensor, indices: Any, value: torch.Tensor) -> str | None:
    """``index_put_with_sort_kernel``: launched only where something is indexed (an integer
    index of no elements, or an empty destination, launches nothing), dispatched on the value's
    type, reading the destination as that type."""
    given = [i for i in (indices or ()) if isinstance(i, torch.Tensor)]
    empty = [i for i in given if i.dtype not in (torch.bool, torch.uint8) and i.numel() == 0]
    if empty or self.numel() == 0:
        return None
    return f"expected scalar type {_st(value)} but found {_st(self)}"


def _index_put_impl(device_type: str) -> Check:
    """``_index_put_impl_`` (``index_put``, ``index_put_`` reach it): ``make_index_put_iterator``'s
    check, unless the masked-fill path or (CUDA) the sort path and its kernel's check take the
    call."""

    def check(args: tuple[Any, ...]) -> str | None:
        self, indices, values = args[:3]
        accumulate = args[3] if len(args) > 3 else False
        if not isinstance(values, torch.Tensor) or values.dtype == self.dtype:
            return None
        if not accumulate and _masked_fill_path(self, indices, values):
            return None
        if device_type == "cuda" and _sort_path(values, accumulate):
            return _sort_kernel(self, indices, values)
        return (
            f"Index put requires the source and destination dtypes match, got {_st(self)} for "
            f"the destination and {_st(values)} for the source."
        )

    return check


def _masked_index_put(device_type: str) -> Check:
    """``_unsafe_masked_index_put_accumulate`` (``TensorAdvancedIndexing.cpp``) is
    ``_unsafe_index_put`` of its values with ``accumulate``, every device."""
    index_put = _index_put_impl(device_type)

    def check(args: tuple[Any, ...]) -> str | None:
        return index_put((args[0], args[2], args[3], True))

    return check


def _index_func(name: str) -> Check:
    """``index_func_meta_impl``, the structured meta function of ``index_add`` and
    ``index_reduce`` on every device."""

    def check(args: tuple[Any, ...]) -> str | None:
        self, source = args[0], args[3]
        if self.dtype != source.dtype:
            return (
                f"{name}_(): self ({_st(self)}) and source ({_st(source)}) must have the same "
                "scalar type"
            )
        return None

    return check


def _index_copy(args: tuple[Any, ...]) -> str | None:
    """``TORCH_PRECOMPUTE_META_FUNC(index_copy)``, every device."""
    self, source = args[0], args[3]
    if self.dtype != source.dtype:
        return (
            "index_copy_(): self and source expected to have the same dtype, but got (self) "
            f"{_st(self)} and (source) {_st(source)}"
        )
    return None


def _masked_scatter_cpu(args: tuple[Any, ...]) -> str | None:
    """CPU ``masked_scatter`` (the missing space is the kernel's)."""
    self, source = args[0], args[2]
    if self.dtype != source.dtype:
        return (
            "masked_scatter: expected self and source to have same dtypes but got"
            f"{_st(self)} and {_st(source)}"
        )
    return None


def _put(args: tuple[Any, ...]) -> str | None:
    """``put_`` in ``TensorAdvancedIndexing.cpp`` (device-generic; ``put`` clones into it)."""
    self, source = args[0], args[2]
    if self.dtype != source.dtype:
        return (
            "put_(): self and source expected to have the same dtype, but got self.dtype = "
            f"{_st(self)} and source.dtype = {_st(source)}"
        )
    return None


def _both(op: Any, check: Check) -> dict[tuple[str, Any], Check]:
    return {("cpu", op): check, ("cuda", op): check}


_INDEX_PUTS = (aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default)

#: (device type, op) -> a check that returns the real kernel's error message, or None if fine.
INDEX_CHECKS: dict[tuple[str, Any], Check] = {
    **{(d, op): _index_put_impl(d) for op in _INDEX_PUTS for d in ("cpu", "cuda")},
    **{
        (d, aten._unsafe_masked_index_put_accumulate.default): _masked_index_put(d)
        for d in ("cpu", "cuda")
    },
    **_both(aten.index_add.default, _index_func("index_add")),
    **_both(aten.index_add_.default, _index_func("index_add")),
    **_both(aten.index_copy.default, _index_copy),
    **_both(aten.index_copy_.default, _index_copy),
    **_both(aten.index_reduce.default, _index_func("index_reduce")),
    **_both(aten.index_reduce_.default, _index_func("index_reduce")),
    **_both(aten.put.default, _put),
    **_both(aten.put_.default, _put),
    ("cpu", aten.masked_scatter.default): _masked_scatter_cpu,
    ("cpu", aten.masked_scatter_.default): _masked_scatter_cpu,
}

__all__ = ["INDEX_CHECKS"]
