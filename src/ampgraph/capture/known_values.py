"""Values a real run computes shapes from: a model's small integer buffers, followed on their
real values while the forward is traced on fake tensors.

A capture swaps every parameter and buffer for a fake tensor, which has a shape and a dtype and no
values. Some models keep sizes in buffers: EnCodec's convolutions hold ``kernel_size`` and
``stride`` as 0-d int64 buffers and pad their input by ``kernel_size - stride`` and by an extra
length computed from them with ``torch.ceil``. On fake tensors each such value is an unknown
(``Eq(u0, 1)`` where the code compares two of them, a zero-length convolution input further
on), where a real run simply knows it. :class:`KnownValues` is a ``TorchFunctionMode`` that
carries, beside each fake tensor made from such a buffer, the buffer's real value; every torch
call whose tensors all carry one is computed on the real values too, and a call that reads a
value into Python (``int()``, ``bool()``, ``.item()``, ``.tolist()``, a size argument) gets the
real one: the trace takes the path and the sizes a real run takes, with the computed values as
constants of the graph, as export bakes any Python number. Only integer and bool buffers of at
most :data:`LIMIT` elements of a model built for real are followed: sizes, strides and counts,
never data a run is fed.

>>> import torch
>>> from torch._subclasses.fake_tensor import FakeTensorMode
>>> real = torch.tensor(5)
>>> with FakeTensorMode() as mode:
...     fake = torch.empty((), dtype=torch.int64)
>>> with KnownValues({id(fake): (fake, real)}), mode:
...     int((fake - 2) * 3)
9
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

#: The most elements a followed buffer (and a value computed from one) may have.
LIMIT = 64

#: Calls that read a tensor's value into Python: answered from the real value.
VALUE_READS = frozenset({
    "item", "__index__", "__int__", "__bool__", "__float__", "tolist", "__format__",
})  # fmt: skip


def follows(tensor: torch.Tensor) -> bool:
    """Whether a capture follows ``tensor``'s real value: an integer or bool buffer of at most
    :data:`LIMIT` elements, held for real (not on meta, not fake).

    >>> follows(torch.tensor(3)), follows(torch.tensor(0.5))
    (True, False)
    >>> follows(torch.zeros(LIMIT + 1, dtype=torch.int64))
    False
    """
    from torch._subclasses.fake_tensor import FakeTensor

    return not (
        isinstance(tensor, (nn.Parameter, FakeTensor))
        or tensor.is_meta
        or tensor.is_floating_point()
        or tensor.is_complex()
        or tensor.numel() > LIMIT
    )


def _real(call: Any, args: Any, kwargs: Any) -> Any:
    """``call`` on real tensors, past every mode of the trace (fake tensors, the tracer)."""
    with _disable_current_modes(), torch._C.DisableTorchFunction():
        return call(*args, **kwargs)


class KnownValues(TorchFunctionMode):
    """Fake tensors with their real values beside them (see the module docstring): ``known``
    maps ``id(fake)`` to ``(fake, real)``; values computed from them are added as the forward
    runs, for as long as the mode lasts."""

    def __init__(self, known: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        super().__init__()
        # Shared with :func:`remembering`, which fills it as the tensors are swapped. The fake
        # tensor is kept with its value, so that its id is not reused while this lasts.
        self._known = known

    def value(self, t: Any) -> torch.Tensor | None:
        """``t``'s real value, or None where it carries none."""
        pair = self._known.get(id(t)) if isinstance(t, torch.Tensor) else None
        return pair[1] if pair is not None and pair[0] is t else None

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if not self._known:  # a model without such buffers: nothing to look for
            return func(*args, **kwargs)
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        values = [self.value(t) for t in tensors]
        if not tensors or not any(v is not None for v in values):
            return func(*args, **kwargs)
        if any(v is None for v in values):
            # A value the call takes as a size (``F.pad(x, (left, right))``): its real number.
            args, kwargs = pytree.tree_map_only(
                (list, tuple), self._sizes, (args, kwargs), is_leaf=_is_size_list
            )
            return func(*args, **kwargs)
        real_args, real_kwargs = pytree.tree_map_only(torch.Tensor, self.value, (args, kwargs))
        name = getattr(func, "__name__", "")
        if name in VALUE_READS:
            return _real(func, real_args, real_kwargs)
        out = func(*args, **kwargs)
        try:
            real_out = _real(func, real_args, real_kwargs)
        except Exception:  # noqa: BLE001 - not computable on the CPU values: no longer followed
            return out
        fakes, reals = pytree.tree_leaves(out), pytree.tree_leaves(real_out)
        for fake, real in zip(fakes, reals) if len(fakes) == len(reals) else ():
            if (
                isinstance(fake, torch.Tensor)
                and isinstance(real, torch.Tensor)
                and fake.shape == real.shape
                and real.numel() <= LIMIT
            ):
                self._known[id(fake)] = (fake, real)
        return out

    def _sizes(self, seq: Any) -> Any:
        """``seq`` with each followed 0-d tensor in it as its Python number."""
        made = [
            _real(torch.Tensor.item, (v,), {})
            if (v := self.value(item)) is not None and v.dim() == 0
            else item
            for item in seq
        ]
        return type(seq)(made) if isinstance(seq, tuple) and not hasattr(seq, "_fields") else made


def remembering(
    make: Callable[[torch.Tensor], torch.Tensor],
    known: dict[int, tuple[torch.Tensor, torch.Tensor]],
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``make`` (a capture's maker of fake parameters and buffers), noting in ``known`` each fake
    tensor made from a buffer :func:`follows`, with a copy of its real value."""

    def make_and_remember(t: torch.Tensor) -> torch.Tensor:
        new = make(t)
        if follows(t):
            known[id(new)] = (new, t.detach().clone())
        return new

    return make_and_remember


def _is_size_list(node: Any) -> bool:
    """A list or tuple of numbers and 0-d tensors: what torch reads as sizes."""
    return isinstance(node, (list, tuple)) and any(
        isinstance(i, torch.Tensor) and i.dim() == 0 for i in node
    ) and all(isinstance(i, (int, torch.Tensor)) for i in node)


__all__ = ["LIMIT", "VALUE_READS", "KnownValues", "follows", "remembering"]
