"""The function a Python kernel calls, read back from the kernel itself
(:mod:`ampgraph.capture.python_kernels`): torch's own record of its Meta kernels is the truth it
must match, torchvision's autocast kernels are found as torchvision wrote them, and what cannot
be named for certain is not named."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch._meta_registrations  # noqa: F401 - its kernels are the truth the test reads

from ampgraph.capture.python_kernels import called_function, python_kernel

META = torch._C.DispatchKey.Meta


def _torch_meta_kernels() -> list[torch._ops.OpOverload]:
    """Every ATen overload whose Meta kernel torch registered in ``_meta_registrations.py``
    (which also puts the function in the op's ``py_kernels``), by name."""
    ops = []
    for packet_name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, packet_name, None)
        for overload in getattr(packet, "overloads", list)():
            op = getattr(packet, overload)
            name = op._schema.name + ("." + overload if overload != "default" else "")
            dump = torch._C._dispatch_dump(name).splitlines()
            where = [ln for ln in dump if ln.startswith("Meta: ")]
            if where and "torch/_meta_registrations.py" in where[0] and META in op.py_kernels:
                ops.append(op)
    return sorted(ops, key=str)


def test_what_the_kernel_calls_is_torchs_own_record_of_its_meta_kernels() -> None:
    """Called on placeholders and stopped at the function's first line, a Meta kernel names
    the very function torch recorded for it, never another: ``out_wrapper``'s and the type
    promotion decorator's ``_fn`` closures share one code object among hundreds of ops, and the
    closure cells tell them apart. One op in 30 (about 45 of 1,300; all of them take 2 minutes,
    where all were named but the 9 whose placeholders torch refuses)."""
    ops = _torch_meta_kernels()
    assert len(ops) > 1000
    sample = ops[::30]
    found = {op: called_function(op, "Meta") for op in sample}
    named = {op: k for op, k in found.items() if k is not None}
    assert [str(op) for op, k in named.items() if k.function is not op.py_kernels[META]] == []
    assert len(named) >= 0.9 * len(sample), sorted(str(op) for op in found if op not in named)
    assert not any(k.with_keyset for k in named.values())


@pytest.mark.parametrize(
    ("op", "key", "function"),
    [("roi_align", key, "_autocast_roi_align")
     for key in ("AutocastCPU", "AutocastCUDA", "AutocastXPU")]
    + [("nms", "AutocastCPU", "_autocast_nms"), ("roi_pool", "AutocastCUDA", "_autocast_roi_pool"),
       ("deform_conv2d", "AutocastCUDA", "_autocast_deform_conv2d")],
)  # fmt: skip
def test_torchvisions_autocast_kernels_are_its_own_functions(
    op: str, key: str, function: str
) -> None:
    """torchvision 0.29 writes them in Python (``_autograd_registrations.py``); older releases
    in C++, where there is no function to read back."""
    pytest.importorskip("torchvision")
    owner = pytest.importorskip("torchvision._autograd_registrations")
    python, kernel = python_kernel(getattr(torch.ops.torchvision, op).default, key)
    assert python and kernel is not None
    assert kernel.function is getattr(owner, function) and not kernel.with_keyset


@pytest.fixture
def library() -> Iterator[torch.library.Library]:
    """A library of its own, whose ops go with it."""
    lib = torch.library.Library("ampgraph_probe_test", "DEF")  # noqa: TOR901 - destroyed below
    lib.define("scale(Tensor x, Tensor w) -> Tensor")
    lib.define("odd(Tensor x, float factor=2.0) -> Tensor")
    yield lib
    lib._destroy()


def test_register_autocast_gets_the_key_set_and_a_callable_object_is_not_named(
    library: torch.library.Library,
) -> None:
    """``register_autocast`` registers a closure ``with_keyset`` (its ``kernel(_, *args)``, one
    code object for every op so registered); an instance with ``__call__`` enters its method
    with ``self`` first, which is not the function torch holds, so it is named as nothing."""
    torch.library.register_autocast("ampgraph_probe_test::scale", "cpu", torch.float32, lib=library)

    class Kernel:
        def __call__(self, x: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
            return x * factor

    library.impl("odd", Kernel(), "AutocastCPU")
    python, scale = python_kernel(torch.ops.ampgraph_probe_test.scale.default, "AutocastCPU")
    assert python and scale is not None and scale.with_keyset
    assert scale.function.__qualname__ == "register_autocast.<locals>.kernel"
    [cell] = scale.function.__closure__ or ()
    assert cell.cell_contents.__name__ == "_autocast_py_impl"
    assert python_kernel(torch.ops.ampgraph_probe_test.odd.default, "AutocastCPU") == (True, None)
    assert python_kernel(torch.ops.ampgraph_probe_test.odd.default, "AutocastCUDA") == (False, None)
