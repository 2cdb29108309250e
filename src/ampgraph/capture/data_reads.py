"""Reads of a tensor's data that Python makes outside any op, made on a fake tensor as a real run
makes them on a real one.

A capture's tensors are fake: shapes and dtypes, no data. Ops on them are recorded, and an op
that reads a value into Python (``.item()``, ``int()``) gives a data-dependent number that the
capture follows on real values where it has them (:mod:`ampgraph.capture.known_values`, the
data path's seeded run). Two reads of data bypass that, and went wrong on fake tensors only:

* **formatting a 0-d tensor** (``self.experts[f"expert_{idx}"]``, SwitchTransformers' sparse
  MLP). ``Tensor.__format__`` formats a 0-d tensor's value (``self.item().__format__(spec)``)
  only where ``type(self) is Tensor``; a fake tensor is a subclass, so it formats its repr and
  the model looks up a module named ``expert_FakeTensor(..., size=(), dtype=torch.int64)``.
  Here it formats the value as a real run does: ``.item()``, then the Python number, which is a
  data-dependent guard where the value is unknown (the capture then follows the data's path) and
  the real number where the trace runs on real values (draft export) or knows them.
* **a tensor made from a sequence of 0-d tensors**: an index ``x[rows, cols]`` whose ``rows`` is
  a tuple of 0-d tensors (UDOP's ``rows, cols = zip(*ind)``; also written ``x[[rows, cols]]``,
  a list torch takes as a tuple), ``torch.tensor([t0, t1])`` (ERNIE-VL's rope deltas) or
  ``x.new_tensor([t0, t1])``. torch's C++ conversion reads each element's data, which a fake
  tensor has none of (``The tensor has a non-zero number of elements, but its data is not
  allocated yet``; on a fake CUDA tensor, a copy to the host first: ``Found no NVIDIA driver
  on your system``), and the whole model was lost. Here the same tensor is computed from the
  elements (``torch.stack``), in the dtype and on the device the conversion gives: the graph
  computes the index from the values the real run reads, for any values.

:class:`DataReads` is a ``TorchFunctionMode`` the capture's traces and the eager hooks run
under; it acts only on tensors without data (fake or meta), so a real tensor goes through
torch untouched.

>>> from torch._subclasses.fake_tensor import FakeTensorMode
>>> with FakeTensorMode(), DataReads():
...     x = torch.zeros(3, 3)
...     ind = torch.zeros(2, 2, dtype=torch.int64)
...     rows, cols = zip(*ind)
...     x[rows, cols].shape
torch.Size([2])
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

#: The ``torch`` functions that make a tensor by reading their data argument's values.
_FROM_DATA = (torch.tensor, torch.as_tensor)
_INDEXING = (torch.Tensor.__getitem__, torch.Tensor.__setitem__)
#: Frames no read is the model's own: torch's and ampgraph's.
_NOT_THE_MODELS = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
)


def at_the_models_line() -> contextlib.AbstractContextManager[Any]:
    """While a read runs, the tracing context names the model's line that made it (the nearest
    frame outside torch and ampgraph). torch reports where a forward decided on data from the
    innermost frames outside torch (``torch._logging.structured.get_user_stack``), and those
    would be this mode's, not the model's line, unless the tracing context names a frame."""
    from torch._guards import TracingContext

    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_NOT_THE_MODELS):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None or TracingContext.try_get() is None:
        return contextlib.nullcontext()
    code = frame.f_code
    return TracingContext.current_frame(
        traceback.FrameSummary(code.co_filename, frame.f_lineno, code.co_name)
    )


def without_data(t: Any) -> bool:
    """Whether ``t`` is a tensor that holds no data a read could give (fake or meta).

    >>> without_data(torch.ones(1)), without_data(torch.ones(1, device="meta"))
    (False, True)
    """
    from torch._subclasses.fake_tensor import is_fake

    return isinstance(t, torch.Tensor) and (is_fake(t) or t.is_meta)


def _number(value: Any) -> Any:
    """A value ``.item()`` gave, as the Python number a real run formats: a symbolic one
    (an unbacked ``u0``) is asked for its value, a guard on data as any ``int()`` is."""
    if isinstance(value, torch.SymInt):
        return int(value)
    if isinstance(value, torch.SymFloat):
        return float(value)
    if isinstance(value, torch.SymBool):
        return bool(value)
    return value


def _elements(data: Any) -> list[Any] | None:
    """The leaves of ``data``, a nested list or tuple of 0-d tensors and Python numbers with at
    least one tensor without data; None for anything else (what torch converts by itself)."""
    if not isinstance(data, (list, tuple)) or not data:
        return None
    leaves = pytree.tree_leaves(data)
    if not all(
        (isinstance(leaf, torch.Tensor) and leaf.dim() == 0)
        or isinstance(leaf, (bool, int, float))
        for leaf in leaves
    ):
        return None
    return leaves if any(without_data(leaf) for leaf in leaves) else None


def _converted_dtype(data: Any) -> torch.dtype:
    """The dtype torch's conversion gives ``data``: asked of the conversion itself, on real
    zero-valued CPU tensors of the same dtypes (the dtype never depends on the values)."""
    with _disable_current_modes(), torch._C.DisableTorchFunction():
        zeros = pytree.tree_map_only(torch.Tensor, lambda t: torch.zeros((), dtype=t.dtype), data)
        return torch.tensor(zeros).dtype


def _stacked(data: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``data`` (see :func:`_elements`) as one tensor, computed from its elements."""
    if isinstance(data, (list, tuple)):
        return torch.stack([_stacked(item, dtype, device) for item in data])
    if isinstance(data, torch.Tensor):
        return data.to(device=device, dtype=dtype)
    return torch.full((), data, dtype=dtype, device=device)


def _as_index(item: Any, device: torch.device) -> Any:
    """One element of an index tuple: a sequence of 0-d tensors as the index tensor the C++
    conversion would make of its values (integer or bool, as inferred); anything else as is."""
    if _elements(item) is None:
        return item
    dtype = _converted_dtype(item)
    if dtype.is_floating_point or dtype.is_complex:  # the conversion raises: let it
        return item
    return _stacked(item, dtype, device)


def _as_tuple(index: Any) -> bool:
    """Whether torch takes ``index`` as a tuple of indexes: a tuple, or a list of fewer than 32
    items holding a tensor, a sequence, a slice, ``...`` or None (NumPy's rule, which torch's
    ``treatSequenceAsTuple`` follows): ``x[[rows, cols]]`` with ``rows`` a list of 0-d tensors
    is ``x[rows, cols]``, each list converted by reading its elements' data.

    >>> _as_tuple((1, 2)), _as_tuple([[0], [1]]), _as_tuple([0, 1]), _as_tuple(torch.ones(1))
    (True, True, False, False)
    """
    if isinstance(index, tuple):
        return True
    return isinstance(index, list) and len(index) < 32 and any(
        isinstance(item, (torch.Tensor, list, tuple, slice)) or item is ... or item is None
        for item in index
    )


class DataReads(TorchFunctionMode):
    """Python's reads of a fake tensor's data made as a real run makes them (see the module
    docstring): a 0-d tensor formatted by its value, a sequence of 0-d tensors made into a tensor
    from its elements."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is torch.Tensor.__format__ and without_data(args[0]) and args[0].dim() == 0:
            if args[0].is_meta:  # torch formats a meta tensor's repr: it has no value at all
                return func(*args, **kwargs)
            spec = args[1] if len(args) > 1 else kwargs.get("format_spec", "")
            with at_the_models_line():
                return format(_number(args[0].item()), spec)
        if func in _INDEXING and _as_tuple(args[1]):
            device = args[0].device
            with at_the_models_line():
                index = tuple(_as_index(item, device) for item in args[1])
                return func(args[0], index, *args[2:], **kwargs)
        if func in _FROM_DATA and args and _elements(args[0]) is not None:
            with at_the_models_line():
                return self._from_data(args[0], kwargs)
        if func is torch.Tensor.new_tensor and args[1:] and _elements(args[1]) is not None:
            # ``x.new_tensor(data)``: the same conversion, in ``x``'s dtype and on its device
            # unless given (a fake CUDA ``x``'s elements read for real: "Found no NVIDIA driver").
            like = {"dtype": args[0].dtype, "device": args[0].device}
            with at_the_models_line():
                return self._from_data(args[1], {**like, **{k: v for k, v in kwargs.items() if v}})
        with at_the_models_line():  # a guard inside any op: the model's line, not this frame
            return func(*args, **kwargs)

    @staticmethod
    def _from_data(data: Any, kwargs: Any) -> torch.Tensor:
        """``torch.tensor(data)`` of 0-d tensors: their stack, in the dtype and on the device
        the conversion gives (``dtype=``, or inferred; ``device=``, or the default device)."""
        dtype = kwargs.get("dtype") or _converted_dtype(data)
        device = kwargs.get("device") or torch.get_default_device()
        out = _stacked(data, dtype, torch.device(device))
        # torch.tensor copies: the result is a new leaf, detached from the elements' graph.
        out = out.detach()
        return out.requires_grad_() if kwargs.get("requires_grad") else out


__all__ = ["DataReads", "at_the_models_line", "without_data"]
