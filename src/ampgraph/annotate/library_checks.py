"""The dtype checks of library kernels (torchvision's roi ops), in each device's real words.

torchvision's meta kernels (``torchvision/_meta_registrations.py``) check that ``input`` and
``rois`` share a dtype, with a message of their own. The real kernels check it too, in other
words: ``at::checkAllSameType`` in every CUDA kernel and in CPU's ``ps_roi_*``, a
``TORCH_CHECK`` naming its source file in CPU's ``roi_align``. A prediction made with the meta
kernel's message never matched a real run: the H100 survey of 2026-11-26
(``docs/verification/cuda-survey.md``, the roi cases in ``half``) and the CPU's. So:

* on CPU the real kernel is at hand: it runs on one-element tensors of the same dtypes, and its
  message is the prediction's, whatever torchvision build is installed;
* on CUDA the message is ``checkAllSameType``'s (``aten/src/ATen/TensorUtils.cpp``), as the
  H100 printed it for ``roi_align``: ``... but type CUDABFloat16Type does not equal
  torch.cuda.FloatTensor (while checking arguments for roi_align_forward_kernel)``.

>>> import torch
>>> roi_message("cuda", "roi_pool", torch.empty(1, dtype=torch.float16), torch.empty(1))[:61]
"Expected tensor for argument #1 'input' to have the same type"
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ampgraph.annotate.device_kernels import _type_string

Check = Callable[[tuple[Any, ...]], str | None]

#: torchvision's ops whose kernels check ``input`` against ``rois`` (all four: the same check).
ROI_OPS = ("roi_align", "roi_pool", "ps_roi_align", "ps_roi_pool")


def roi_message(
    device_type: str, name: str, x: torch.Tensor, rois: torch.Tensor, args: tuple[Any, ...] = ()
) -> str | None:
    """The real kernel's error for ``input`` and ``rois`` of different dtypes, else None."""
    if x.dtype == rois.dtype:
        return None
    if device_type == "cuda":
        return (
            "Expected tensor for argument #1 'input' to have the same type as tensor for "
            f"argument #2 'rois'; but type {_type_string(x)} does not equal "
            f"{_type_string(rois)} (while checking arguments for {name}_forward_kernel)"
        )
    return _cpu_message(name, x.dtype, rois.dtype, args)


def _cpu_message(
    name: str, x_dtype: torch.dtype, rois_dtype: torch.dtype, args: tuple[Any, ...]
) -> str | None:
    """The CPU kernel's own words: it runs, for real, on one-element tensors of the dtypes."""
    pooled = (int(args[3]), int(args[4])) if len(args) > 4 else (1, 1)
    op = getattr(torch.ops.torchvision, name).default
    with _disable_current_modes():  # real tensors, whatever fake mode the replay runs in
        x = torch.zeros(1, pooled[0] * pooled[1], 1, 1, dtype=x_dtype)
        rois = torch.zeros(1, 5, dtype=rois_dtype)
        rest = (1.0, *pooled, *([0] if name == "ps_roi_align" else []),
                *([0, False] if name == "roi_align" else []))  # fmt: skip
        try:
            op(x, rois, *rest)
        except RuntimeError as exc:
            return str(exc).split("\n")[0]
    return None


def _roi_check(device_type: str, name: str) -> Check:
    def check(args: tuple[Any, ...]) -> str | None:
        x, rois = args[0], args[1]
        if not (isinstance(x, torch.Tensor) and isinstance(rois, torch.Tensor)):
            return None
        return roi_message(device_type, name, x, rois, args)

    check.__doc__ = f"torchvision ``{name}``'s ``input``/``rois`` dtype check ({device_type})."
    return check


@functools.cache
def library_check(device_type: str, func: Any) -> Check | None:
    """The check of a library op on ``device_type``, if ampgraph knows one.

    >>> import torch, torchvision  # doctest: +SKIP
    >>> library_check("cuda", torch.ops.torchvision.roi_align.default) is not None  # doctest: +SKIP
    True
    """
    schema = getattr(func, "_schema", None)
    namespace, _, name = (schema.name if schema is not None else "").partition("::")
    if namespace != "torchvision" or name not in ROI_OPS or device_type not in ("cpu", "cuda"):
        return None
    return _roi_check(device_type, name)


__all__ = ["ROI_OPS", "library_check", "roi_message"]
