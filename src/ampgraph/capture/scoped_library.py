"""Kernels registered with torch's dispatcher for a while, then taken back without a trace.

``torch.library.Library._destroy()`` pops a library's registrations from the dispatcher (the
dispatcher keeps a stack of them per op and key, and ``_dispatch_dump`` shows torch's kernel
again), but two other records of them stay, on torch 2.9 to 2.14:

* **the map of Python kernels** the dispatcher's trampoline calls through
  (``python_registrations_`` in ``torch/csrc/utils/python_dispatch.cpp``): one entry per op and
  key, overwritten by every ``Library.impl`` and never erased. A kernel written in Python (torch's
  own Meta kernels from ``torch/_meta_registrations.py``, for ``_grouped_mm``, ``addr``,
  ``huber_loss``, ...) runs through that map whenever a dispatch mode is active or an argument is
  a tensor subclass: every fake tensor, ``make_fx``, ``torch.compile``. So after ``_destroy`` a
  fake tensor still ran the kernel registered last, ampgraph's, for the rest of the process, where
  a plain meta tensor ran torch's.
* ``torch.library._impls``, the keys ``Library.impl(..., allow_override=False)`` refuses:
  ``_destroy`` (and the library's finalizer, later) removes the library's keys from it, those that
  torch's own libraries had put there too.

:class:`ScopedLibrary` notes both before it registers and puts them back when destroyed (and
empties fake tensors' cache of outputs, which is keyed by the inputs, not by the kernel that
typed them, on both sides): the map's entry by registering the kernel that was there once more,
in a library of its own destroyed at once (the dispatcher's stack is left as it was, the map
names that kernel again), the keys by adding them back. The kernel that was there is known
where torch registered it from ``torch/_meta_registrations.py`` (every Meta kernel ampgraph
replaces), which puts the same function in the op's ``py_kernels``. A kernel another library
registered from Python (torchvision 0.29's autocast kernels, which a what-if may move) cannot be
read back from torch, so its map entry stays the what-if's after it (a fake tensor under autocast
would run the moved kernel): :attr:`ScopedLibrary.unrestorable` names such registrations.

>>> import torch
>>> from torch._subclasses.fake_tensor import FakeTensorMode
>>> def addr() -> torch.dtype:
...     with FakeTensorMode():
...         v = torch.empty(3, dtype=torch.bfloat16)
...         return torch.addr(torch.empty(()), v, v).dtype
>>> lib = ScopedLibrary("aten")
>>> lib.impl("addr", lambda self, v1, v2, **kw: v1.new_empty((3, 3), dtype=torch.float16), "Meta")
>>> addr()
torch.float16
>>> lib.destroy()
>>> addr()
torch.bfloat16
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.library
from torch._subclasses.fake_tensor import FakeTensorMode

from ampgraph.compat import replace_kernel

#: Where torch registers its Python Meta kernels; ``activate_meta`` there registers each function
#: both at the dispatcher and in the op's ``py_kernels``, which is how the function is read back.
_TORCH_META_REGISTRATIONS = "torch/_meta_registrations.py"


def _overload(namespace: str, name: str | torch._ops.OpOverload) -> torch._ops.OpOverload:
    """The overload ``name`` names (``"addr"``, ``"gru.input"``, or the overload itself)."""
    if isinstance(name, torch._ops.OpOverload):
        return name
    base, _, overload = name.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), base), overload or "default")


def _python_kernel(op: torch._ops.OpOverload, key: str) -> tuple[bool, Callable[..., Any] | None]:
    """Whether the kernel that runs for ``op`` at ``key`` now is written in Python (the
    dispatcher calls it through the map), and the function, where it can be known."""
    qualified = op._schema.name + (f".{op._overloadname}" if op._overloadname != "default" else "")
    active = [
        line for line in torch._C._dispatch_dump(qualified).splitlines()
        if line.startswith(f"{key}: ")
    ]  # fmt: skip
    if not active or ".py:" not in active[0].split(" :: ")[0]:
        return False, None  # a C++ kernel, or none: the map is never read for this key
    if _TORCH_META_REGISTRATIONS in active[0].replace("\\", "/"):
        return True, op.py_kernels.get(getattr(torch._C.DispatchKey, key))
    return True, None


class ScopedLibrary:
    """``torch.library.Library(namespace, "IMPL")`` whose :meth:`destroy` leaves torch as it was
    before the first :meth:`impl`, the map of Python kernels and ``torch.library._impls`` too."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        lib = torch.library.Library(namespace, "IMPL")  # noqa: TOR901 - destroyed by destroy()
        self._lib: torch.library.Library | None = lib
        #: (name, key, the Python kernel that was there) for each registration over one.
        self._previous: list[tuple[str | torch._ops.OpOverload, str, Callable[..., Any]]] = []
        #: ``_impls`` keys that were there before this library's registrations.
        self._kept: set[str] = set()
        #: Registrations over a Python kernel this library cannot read back (``op/key``).
        self.unrestorable: list[str] = []

    def impl(self, name: str | torch._ops.OpOverload, kernel: Callable[..., Any], key: str) -> None:
        """Register ``kernel`` for ``name`` at dispatch key ``key``, over any kernel there."""
        if self._lib is None:
            raise RuntimeError("this ScopedLibrary was destroyed")
        op = _overload(self.namespace, name)
        if not self._lib._op_impls:
            FakeTensorMode.cache_clear()
        python, previous = _python_kernel(op, key)
        before = set(torch.library._impls)
        with warnings.catch_warnings():  # "Overriding a previously registered kernel": meant
            warnings.simplefilter("ignore")
            replace_kernel(self._lib, name, kernel, key)
        self._kept |= {k for k in self._lib._op_impls if k in before}
        if previous is not None:
            self._previous.append((name, key, previous))
        elif python:
            self.unrestorable.append(f"{op}/{key}")

    def destroy(self) -> None:
        """Take every registration back; the map's entries and ``_impls`` as they were."""
        lib, self._lib = self._lib, None
        if lib is None:
            return
        lib._destroy()
        # The finalizer torch set on the library subtracts this same set again when the object
        # goes: emptied, it takes nothing that was put back below.
        lib._op_impls.clear()
        for name, key, previous in self._previous:
            again = torch.library.Library(self.namespace, "IMPL")  # noqa: TOR901
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                replace_kernel(again, name, previous, key)
            again._destroy()
            again._op_impls.clear()
        self._previous.clear()
        torch.library._impls.update(self._kept)
        FakeTensorMode.cache_clear()


__all__ = ["ScopedLibrary"]
