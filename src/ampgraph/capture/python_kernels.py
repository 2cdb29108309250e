"""Which Python function the dispatcher calls for an op at a dispatch key, read back from torch.

A function registered with ``torch.library.Library.impl`` is kept by torch where Python cannot
read it: in the kernel at the key (``PythonKernelHolder`` in
``torch/csrc/utils/python_dispatch.cpp``) and in the map of Python kernels the dispatcher's
trampoline calls through (:mod:`ampgraph.capture.scoped_library` says when). ``Library`` keeps
only the keys it registered, ``OpOverload.py_kernels`` only what ``py_impl`` was given. To put
the map back after registering over such a function, :class:`~ampgraph.capture.scoped_library.
ScopedLibrary` needs the function itself; :func:`python_kernel` finds it in one of two ways.

* **Torch's own Meta kernels** (``torch/_meta_registrations.py``): ``activate_meta`` registers
  each function at the dispatcher and in the op's ``py_kernels``, where it is read.
* **Any other** (torchvision 0.29's autocast kernels, ``torch.library.register_autocast``'s):
  the kernel itself says, when called. :func:`python_kernel` calls the op's kernel at that key
  alone (``redispatch_boxed`` with the key's set) on empty meta tensors and zeros, with no
  dispatch mode active (under one, the kernel would call the map's function instead of its own),
  and stops the call as the kernel's function is entered (a profiler's ``call`` event raises),
  before a line of it runs. The entered frame's code and closure cells name exactly one function,
  and its arguments are the very objects passed (the tensors themselves), or nothing is taken.
  A kernel registered ``with_keyset`` gets the key set first, as its registration asks.

>>> import torch
>>> lib = torch.library.Library("doctest_kernels", "FRAGMENT")
>>> lib.define("twice(Tensor x) -> Tensor")
'twice'
>>> def twice_in_fp32(x):
...     with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet("AutocastCPU")):
...         return torch.ops.doctest_kernels.twice(x.float())
>>> lib.impl("twice", twice_in_fp32, "AutocastCPU")
>>> python, kernel = python_kernel(torch.ops.doctest_kernels.twice.default, "AutocastCPU")
>>> python, kernel.function is twice_in_fp32, kernel.with_keyset
(True, True, False)
>>> python_kernel(torch.ops.aten.addmm.default, "AutocastCPU")  # a C++ kernel
(False, None)
>>> lib._destroy()
"""

from __future__ import annotations

import gc
import inspect
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

#: Where torch registers its Python Meta kernels; ``activate_meta`` there registers each function
#: both at the dispatcher and in the op's ``py_kernels``, which is how the function is read back.
_TORCH_META_REGISTRATIONS = "torch/_meta_registrations.py"

#: A value of each schema type a kernel's arguments convert from (an optional one gets ``None``).
_PLACEHOLDERS: dict[str, Callable[[], Any]] = {
    "TensorType": lambda: torch.empty(0, device="meta"),
    "IntType": lambda: 0,
    "FloatType": lambda: 0.0,
    "BoolType": lambda: False,
    "NumberType": lambda: 0,
    "StringType": lambda: "",
    "ListType": list,
}


@dataclass(frozen=True)
class PythonKernel:
    """The function a Python kernel calls, and whether it gets the dispatch key set first."""

    function: Callable[..., Any]
    with_keyset: bool = False


class _Entered(BaseException):
    """Raised by the profiler as the kernel's function is entered: none of its code runs."""


def _registration(op: torch._ops.OpOverload, key: str) -> str | None:
    """The file the kernel at ``key`` was registered from, as ``_dispatch_dump`` names it: a C++
    source, or the Python file (or ``<string>``, ``<ipython-input-...>``) that created the
    ``torch.library.Library``. ``None``: no kernel, or a fallthrough, which the dispatcher never
    calls through the map."""
    qualified = op._schema.name + (f".{op._overloadname}" if op._overloadname != "default" else "")
    lines = torch._C._dispatch_dump(qualified).splitlines()
    where = next((ln.split(" :: ")[0] for ln in lines if ln.startswith(f"{key}: ")), None)
    if where is None or torch._C._dispatch_kernel_for_dispatch_key_is_fallthrough(qualified, key):
        return None
    return where.partition("registered at ")[2].rpartition(":")[0].replace("\\", "/")


def _from_python(where: str) -> bool:
    """Whether a kernel registered from ``where`` is a Python one: a ``.py`` file, or code
    without one (``python -c``, ``exec``, a notebook cell), as a Python frame names it."""
    return where.endswith(".py") or where.startswith("<") and where.endswith(">")


def _arguments(op: torch._ops.OpOverload) -> tuple[list[Any], dict[str, Any]] | None:
    """Arguments for ``op`` as the dispatcher hands them to a Python kernel: positional ones up
    to the last without a default (defaults as they are), keyword-only ones without a default;
    ``None`` where a type has no placeholder here."""
    schema = op._schema.arguments
    positional = [a for a in schema if not a.kwarg_only]
    last = max((i for i, a in enumerate(positional) if not a.has_default_value()), default=-1)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for i, a in enumerate(schema):
        if a.kwarg_only and a.has_default_value() or not a.kwarg_only and i > last:
            continue
        if a.has_default_value():
            value = a.default_value
        elif a.type.kind() == "OptionalType":
            value = None
        elif str(a.real_type) == "ScalarType":  # an int in the schema, a dtype in Python
            value = torch.float32
        elif a.type.kind() in _PLACEHOLDERS:
            value = _PLACEHOLDERS[a.type.kind()]()
        else:
            return None
        if a.kwarg_only:
            kwargs[a.name] = value
        else:
            args.append(value)
    return args, kwargs


def _entered(op: torch._ops.OpOverload, key: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The frame of the first Python function ``op``'s kernel at ``key`` calls with these
    arguments, stopped as it begins; ``None`` if the kernel called none (or refused them)."""
    call = op._handle.redispatch_boxed
    keys = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))
    here = sys._getframe()
    frames: list[types.FrameType] = []

    def profile(frame: types.FrameType, event: str, _: Any) -> None:
        if event == "call" and frame.f_back is here:  # called from C++, below this frame
            frames.append(frame)
            raise _Entered

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        call(keys, *args, **kwargs)
    except _Entered:
        pass
    except Exception:  # noqa: BLE001 - the arguments did not convert: no function was entered
        pass
    finally:
        sys.setprofile(previous)
    return frames[0] if frames else None


def _same(seen: Any, given: Any) -> bool:
    """Whether the kernel's function got ``given``: the tensor itself, an equal value else."""
    if isinstance(given, torch.Tensor):
        return seen is given
    if isinstance(given, (list, tuple)):
        return (
            isinstance(seen, (list, tuple))
            and len(seen) == len(given)
            and all(_same(s, g) for s, g in zip(seen, given))
        )
    if isinstance(given, dict):
        return isinstance(seen, dict) and seen.keys() == given.keys() and all(
            _same(seen[k], given[k]) for k in given
        )
    return type(seen) is type(given) and bool(seen == given)


def _cells_hold(function: types.FunctionType, seen: dict[str, Any]) -> bool:
    """Whether ``function``'s closure cells hold what the frame saw in its free variables (one
    function of the closures sharing a code object)."""
    for name, cell in zip(function.__code__.co_freevars, function.__closure__ or ()):
        try:
            if name not in seen or seen[name] is not cell.cell_contents:
                return False
        except ValueError:  # an empty cell
            return False
    return True


def _function(
    frame: types.FrameType, args: list[Any], kwargs: dict[str, Any]
) -> PythonKernel | None:
    """The one function whose code and closure cells ``frame`` runs, if it got exactly these
    arguments (after the key set, if it takes one)."""
    code, seen = frame.f_code, frame.f_locals
    functions = [
        f for f in gc.get_referrers(code)
        if isinstance(f, types.FunctionType) and f.__code__ is code and _cells_hold(f, seen)
    ]  # fmt: skip
    if len(functions) != 1:
        return None
    [function] = functions
    first = seen.get(code.co_varnames[0]) if code.co_argcount else None
    with_keyset = isinstance(first, torch._C.DispatchKeySet)
    # The signature the code itself takes, not one a decorator advertises (``__wrapped__``,
    # ``__signature__``): the frame's variables are the code's.
    bare = types.FunctionType(code, {}, code.co_name, function.__defaults__, function.__closure__)
    bare.__kwdefaults__ = function.__kwdefaults__
    try:
        bound = inspect.signature(bare).bind(*([first] if with_keyset else []), *args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    if not all(name in seen and _same(seen[name], v) for name, v in bound.arguments.items()):
        return None
    return PythonKernel(function, with_keyset)


def called_function(op: torch._ops.OpOverload, key: str) -> PythonKernel | None:
    """The function ``op``'s Python kernel at ``key`` calls, found by calling the kernel and
    stopping it as the function is entered; ``None`` where it cannot be named for certain.

    >>> import torch
    >>> addr = torch.ops.aten.addr.default
    >>> called_function(addr, "Meta").function is addr.py_kernels[torch._C.DispatchKey.Meta]
    True
    """
    with _disable_current_modes():
        arguments = _arguments(op)
        if arguments is None:
            return None
        frame = _entered(op, key, *arguments)
        return None if frame is None else _function(frame, *arguments)


def python_kernel(op: torch._ops.OpOverload, key: str) -> tuple[bool, PythonKernel | None]:
    """Whether the kernel that runs for ``op`` at ``key`` now is written in Python (the
    dispatcher calls it through the map), and its function where it can be read back.

    >>> import torch
    >>> python, kernel = python_kernel(torch.ops.aten.addr.default, "Meta")
    >>> python, kernel.function is torch.ops.aten.addr.default.py_kernels[torch._C.DispatchKey.Meta]
    (True, True)
    """
    where = _registration(op, key)
    if where is None or not _from_python(where):
        return False, None  # a C++ kernel, or none: the map is never read for this key
    if where.endswith(_TORCH_META_REGISTRATIONS):
        known = op.py_kernels.get(getattr(torch._C.DispatchKey, key))
        return True, None if known is None else PythonKernel(known)
    return True, called_function(op, key)


__all__ = ["PythonKernel", "called_function", "python_kernel"]
