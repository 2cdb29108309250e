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
names that kernel again), the keys by adding them back. The kernel that was there is read back
by :func:`~ampgraph.capture.python_kernels.python_kernel`: torch's own Meta kernels from the op's
``py_kernels``, any other (torchvision 0.29's autocast kernels, which a what-if may move) from
the kernel itself. Where that fails, :attr:`ScopedLibrary.unrestorable` names the registration
(its map entry stays this library's kernel after it), or ``restorable_only`` refuses it first.

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

from ampgraph.capture.python_kernels import PythonKernel, python_kernel
from ampgraph.compat import replace_kernel
from ampgraph.errors import AmpgraphError

def _overload(namespace: str, name: str | torch._ops.OpOverload) -> torch._ops.OpOverload:
    """The overload ``name`` names (``"addr"``, ``"gru.input"``, or the overload itself)."""
    if isinstance(name, torch._ops.OpOverload):
        return name
    base, _, overload = name.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), base), overload or "default")


class ScopedLibrary:
    """``torch.library.Library(namespace, "IMPL")`` whose :meth:`destroy` leaves torch as it was
    before the first :meth:`impl`, the map of Python kernels and ``torch.library._impls`` too."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        lib = torch.library.Library(namespace, "IMPL")  # noqa: TOR901 - destroyed by destroy()
        self._lib: torch.library.Library | None = lib
        #: (name, key, the Python kernel that was there) for each registration over one.
        self._previous: list[tuple[str | torch._ops.OpOverload, str, PythonKernel]] = []
        #: (op, key) this library registered: a second registration there is over its own.
        self._registered: set[tuple[str, str]] = set()
        #: ``_impls`` keys that were there before this library's registrations.
        self._kept: set[str] = set()
        #: Registrations over a Python kernel this library cannot read back (``op/key``).
        self.unrestorable: list[str] = []

    def impl(
        self,
        name: str | torch._ops.OpOverload,
        kernel: Callable[..., Any],
        key: str,
        *,
        restorable_only: bool = False,
    ) -> None:
        """Register ``kernel`` for ``name`` at dispatch key ``key``, over any kernel there.

        Over a Python kernel whose function cannot be read back (:mod:`~ampgraph.capture.
        python_kernels`), ``restorable_only`` refuses with an :class:`~ampgraph.errors.
        AmpgraphError` and registers nothing; else the registration is noted in
        :attr:`unrestorable` (its map entry stays ``kernel`` after :meth:`destroy`).
        """
        if self._lib is None:
            raise RuntimeError("this ScopedLibrary was destroyed")
        op = _overload(self.namespace, name)
        python, previous = False, None
        if (str(op), key) not in self._registered:
            python, previous = python_kernel(op, key)
        if python and previous is None and restorable_only:
            raise AmpgraphError(
                f"{op} has a Python kernel at {key} whose function torch does not give back, so "
                f"registering over it would leave it replaced for the rest of the process"
            )
        if not self._lib._op_impls:
            FakeTensorMode.cache_clear()
        before = set(torch.library._impls)
        with warnings.catch_warnings():  # "Overriding a previously registered kernel": meant
            warnings.simplefilter("ignore")
            replace_kernel(self._lib, name, kernel, key)
        self._registered.add((str(op), key))
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
                replace_kernel(again, name, previous.function, key, previous.with_keyset)
            again._destroy()
            again._op_impls.clear()
        self._previous.clear()
        torch.library._impls.update(self._kept)
        FakeTensorMode.cache_clear()


__all__ = ["ScopedLibrary"]
