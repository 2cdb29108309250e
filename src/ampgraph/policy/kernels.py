"""What the installed dispatcher registers for autocast: its keys, kernels and their rules.

Registration metadata only (torch is imported on first use): which ops have an autocast kernel on
a device type, where it was registered, and what a library's kernel does where ampgraph knows it
(:func:`library_rule`). The tables of ATen's own kernels are :mod:`ampgraph.policy`'s.

>>> autocast_key("cpu")
'AutocastCPU'
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from ampgraph.compat import TORCHVISION_AUTOCAST_SITES, custom_op_autocast_dtype
from ampgraph.policy.categories import CAST_INPUTS, FP32, FP32_OUTPUT_AS_INPUT, OPAQUE

#: Autocast kernels that libraries register, with the rule each applies, read from the library's
#: source: qualified op -> (device types it is registered for, category). torchvision 0.29
#: registers them in ``torchvision/_autograd_registrations.py`` (0.24 to 0.26 in C++, alike):
#: every floating (not fp64) tensor argument is cast to fp32 (``_autocast_cast``), and all but
#: ``nms`` cast their outputs back to the input's dtype. ``tests/test_policy.py`` proves the
#: device lists against the dispatcher. A kernel registered anywhere else (another library) is
#: :data:`OPAQUE`.
LIBRARY_KERNELS: Final[dict[str, tuple[tuple[str, ...], str]]] = {
    "torchvision::nms": (("cuda", "cpu", "xpu"), FP32),
    "torchvision::roi_align": (("cuda", "cpu", "xpu"), FP32_OUTPUT_AS_INPUT),
    "torchvision::roi_pool": (("cuda",), FP32_OUTPUT_AS_INPUT),
    "torchvision::ps_roi_align": (("cuda",), FP32_OUTPUT_AS_INPUT),
    "torchvision::ps_roi_pool": (("cuda",), FP32_OUTPUT_AS_INPUT),
    "torchvision::deform_conv2d": (("cuda",), FP32_OUTPUT_AS_INPUT),
}

#: Where the wrappers of :data:`LIBRARY_KERNELS` are registered: fragments of the path the
#: dispatcher names for their registration (``torch._C._dispatch_dump``), one per release line
#: that registers them elsewhere (:data:`ampgraph.compat.TORCHVISION_AUTOCAST_SITES`).
LIBRARY_KERNEL_SOURCES: Final[dict[str, tuple[str, ...]]] = {
    "torchvision": TORCHVISION_AUTOCAST_SITES,
}

#: The dispatch key of each device type's autocast kernels.
AUTOCAST_KEYS: Final[dict[str, str]] = {
    "cuda": "AutocastCUDA",
    "cpu": "AutocastCPU",
    "xpu": "AutocastXPU",
    "mps": "AutocastMPS",
    "mtia": "AutocastMTIA",
    "hpu": "AutocastHPU",
    "xla": "AutocastXLA",
    "privateuseone": "AutocastPrivateUse1",
}


@dataclass(frozen=True)
class KernelRule:
    """What a registered autocast kernel does, as far as ampgraph knows it."""

    #: One of :data:`CATEGORIES`; :data:`OPAQUE` where the kernel is not one ampgraph knows.
    category: str
    #: Where the rule was read from, or why it is not known.
    source: str
    #: For :data:`CAST_INPUTS`: the dtype name (``"float16"``) floating inputs are cast to.
    cast_to: str | None = None


def autocast_key(device_type: str) -> str | None:
    """The dispatch key of ``device_type``'s autocast kernels in this build, or None.

    >>> autocast_key("cuda"), autocast_key("cpu")
    ('AutocastCUDA', 'AutocastCPU')
    """
    import torch

    try:
        key = "Autocast" + torch._C._dispatch_key_for_device(device_type)
    except RuntimeError:  # not a device type torch knows
        key = AUTOCAST_KEYS.get(device_type, "")
    return key if hasattr(torch._C.DispatchKey, key) else None


def autocast_device_types() -> list[str]:
    """Every device type that has an autocast dispatch key in the installed torch, CUDA and CPU
    first. A key with no op-specific kernel (one for a backend this build does not ship, say)
    is listed too: :func:`autocast_kernels` then finds nothing for it.

    >>> autocast_device_types()[:2]
    ['cuda', 'cpu']
    """
    import torch

    found = []
    for key in torch._C.DispatchKey.__members__:
        if key.startswith("Autocast") and key != "Autocast":
            backend = key.removeprefix("Autocast")
            found.append("privateuseone" if backend == "PrivateUse1" else backend.lower())
    order = {"cuda": 0, "cpu": 1}
    return sorted(dict.fromkeys(found), key=lambda d: (order.get(d, 2), d))


def has_autocast_kernel(device_type: str, op_name: str) -> bool:
    """Whether the installed dispatcher has an autocast kernel for ``op_name`` on the device.

    Registration metadata only: it says a kernel exists, never what it returns.

    >>> import torchvision
    >>> has_autocast_kernel("cuda", "torchvision::roi_pool"), has_autocast_kernel("cuda", "aten::add.Tensor")
    (True, False)
    """
    if op_name.startswith("aten::"):
        return _has_aten_kernel(device_type, op_name)  # cached: see registrations_changed
    return _has_kernel(device_type, op_name)


@functools.cache
def _has_aten_kernel(device_type: str, op_name: str) -> bool:
    return _has_kernel(device_type, op_name)


def _has_kernel(device_type: str, op_name: str) -> bool:
    import torch

    key = autocast_key(device_type)
    if key is None:
        return False
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op_name, key))
    except RuntimeError:  # an op the dispatcher has no entry for (prim::device)
        return False


def registrations_changed() -> None:
    """Forget what :func:`has_autocast_kernel` remembered of ATen's registrations, after code
    that registers autocast kernels for a while (:func:`ampgraph.review.whatif.moved_kernels`)."""
    _has_aten_kernel.cache_clear()


def kernel_site(device_type: str, op_name: str) -> str | None:
    """Where the dispatcher says ``op_name``'s autocast kernel was registered (``file:line`` of
    the ``torch.library.Library`` or ``TORCH_LIBRARY_IMPL`` block), or None without one."""
    import torch

    key = autocast_key(device_type)
    if key is None or not has_autocast_kernel(device_type, op_name):
        return None
    match = re.search(
        rf"^{key}: registered at (\S+)", torch._C._dispatch_dump(op_name), re.MULTILINE
    )
    return match.group(1) if match else None


def _register_autocast_dtype(device_type: str, op_name: str) -> str | None:
    """``cast_inputs`` of a ``torch.library.register_autocast`` registration, or None.

    ``register_autocast`` leaves its rule where it can be read back: on a ``custom_op`` in the
    op's definition (``_autocast_dtype``), on any other op as the Python kernel it adds to the
    overload's ``py_kernels``, a closure over ``cast_inputs``.
    """
    import inspect

    import torch
    from torch._library import custom_ops

    base, _, overload = op_name.partition(".")
    opdef = custom_ops.OPDEFS.get(base)
    if opdef is not None and overload in ("", "default"):
        dtype = custom_op_autocast_dtype(opdef, device_type)  # stored otherwise before 2.13
        if isinstance(dtype, torch.dtype):
            return str(dtype).removeprefix("torch.")
    namespace, _, name = base.partition("::")
    try:
        op = getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
    except (AttributeError, RuntimeError):
        return None
    key = autocast_key(device_type)
    kernel = op.py_kernels.get(getattr(torch._C.DispatchKey, key)) if key else None
    if kernel is None or getattr(kernel, "__module__", None) != "torch.library":
        return None
    if not getattr(kernel, "__qualname__", "").startswith("register_autocast.<locals>."):
        return None
    cast = inspect.getclosurevars(kernel).nonlocals.get("cast_inputs")
    return str(cast).removeprefix("torch.") if isinstance(cast, torch.dtype) else None


def python_kernel(device_type: str, op_name: str) -> Callable[..., Any] | None:
    """The Python function a ``torch.library.custom_op`` runs as its real kernel on the device
    type (its ``register_kernel`` for it, else the decorated function), or None for any other op.

    A custom op with no autocast kernel runs that function with autocast still enabled, so the
    torch ops in it are cast on a real run, while its ``register_fake`` runs with autocast off.

    >>> python_kernel("cuda", "aten::mm") is None
    True
    """
    from torch._library import custom_ops

    base, _, overload = op_name.partition(".")
    opdef = custom_ops.OPDEFS.get(base)
    if opdef is None or overload not in ("", "default"):
        return None
    fns = opdef._backend_fns
    return fns.get(device_type) or fns.get(None)


def library_rule(device_type: str, op_name: str) -> KernelRule | None:
    """The rule of a non-ATen op's autocast kernel on ``device_type``; None without a kernel.

    A rule is known where the kernel is ``torch.library.register_autocast``'s
    (:data:`CAST_INPUTS`, its dtype read back from the registration) or a wrapper of
    :data:`LIBRARY_KERNELS` registered where ampgraph read it (:data:`LIBRARY_KERNEL_SOURCES`);
    any other kernel is arbitrary code, and :data:`OPAQUE`.

    >>> import torchvision  # registers its ops and their autocast wrappers
    >>> library_rule("cuda", "torchvision::roi_align").category
    'fp32_output_as_input'
    >>> library_rule("cpu", "torchvision::roi_pool") is None  # no CPU autocast kernel
    True
    """
    if not has_autocast_kernel(device_type, op_name):
        return None
    cast = _register_autocast_dtype(device_type, op_name)
    if cast is not None:
        return KernelRule(
            CAST_INPUTS, f"torch.library.register_autocast (cast_inputs={cast})", cast
        )
    base = op_name.partition(".")[0]
    site = kernel_site(device_type, op_name) or "an unknown place"
    devices, category = LIBRARY_KERNELS.get(base, ((), ""))
    library = base.partition("::")[0]
    path = site.rsplit(":", 1)[0]
    source = next((s for s in LIBRARY_KERNEL_SOURCES.get(library, ()) if s in path), None)
    if device_type in devices and source is not None:
        return KernelRule(category, f"{library}'s wrapper in {path[path.index(source) :]}")
    return KernelRule(OPAQUE, f"a kernel registered at {site}, whose rule ampgraph does not know")
