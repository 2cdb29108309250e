"""Fake CUDA tensors without a GPU driver, on every supported torch (compat.fake_cuda_needs_help).

torch 2.10 on gives fake CUDA tensors a driverless device guard and an SDPA backend choice that
falls back to math by itself; on 2.9 ``capture/driverless_29.py`` does the same. Each check runs
in a fresh process: without that help, 2.9 ends the process (SIGABRT) at the first op on a
parameter that requires grad, which no ``pytest.raises`` could catch.
"""

from __future__ import annotations

import ctypes
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from ampgraph import compat
from ampgraph.capture import driverless_29, elf_symbols

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or not torch.version.cuda,
    reason="needs a CUDA build of torch on a machine without a CUDA device",
)

_PRELUDE = """
import torch
from ampgraph.capture.environment import analysis_environment
from ampgraph.torchutil import fake_mode
_ENVIRONMENT = analysis_environment()  # kept: a collected one would exit
_ENVIRONMENT.__enter__()  # what the release needs, as every analysis has it
"""


def _run(body: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", _PRELUDE + body], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_grad_indexing_and_device_resolution_need_no_driver() -> None:
    """Autograd's InputMetadata asks the guard for a stream; indexing and ``.to("cuda")`` ask it
    for the device. The dtypes are the real autocast kernels' (bf16 linear, fp32 sum)."""
    out = _run("""
with fake_mode():
    w = torch.empty(8, 4, device="cuda", requires_grad=True)
    x = torch.nn.functional.embedding(torch.zeros(2, dtype=torch.long, device="cuda"), w)
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", torch.bfloat16)
    y = torch.nn.functional.linear(x, torch.empty(3, 4, device="cuda", requires_grad=True))
    torch.set_autocast_enabled("cuda", False)
    print(x.grad_fn is not None, y.dtype, y.sum().dtype, x[None, :, None].shape,
          torch.empty(2).to("cuda").device, torch.zeros(3, device="cuda")[1:].device)
""")
    assert out.split() == [
        "True", "torch.bfloat16", "torch.bfloat16", "torch.Size([1,", "2,", "1,", "4])",
        "cuda:0", "cuda:0",
    ]  # fmt: skip


def test_sdpa_takes_the_math_backend_as_torch_does_without_a_device() -> None:
    """The graph of SDPA on fake CUDA tensors is the math backend's, node for node: what 2.10 on
    choose when the device cannot be asked, and what the stand-in gives on 2.9."""
    out = _run("""
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention import SDPBackend, sdpa_kernel
def graph(kw, dtype):
    q = torch.empty(1, 2, 4, 8, device="cuda", dtype=dtype)
    gm = make_fx(lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q, **kw))(q)
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
same = []
with fake_mode():
    for kw in ({}, {"is_causal": True}):
        for dtype in (torch.float16, torch.float32):
            chosen = graph(kw, dtype)
            with sdpa_kernel([SDPBackend.MATH]):
                same.append(chosen == graph(kw, dtype) and "aten.bmm.default" in chosen)
print(all(same), len(same))
""")
    assert out.split() == ["True", "4"]


def test_the_help_is_for_torch_2_9_only_and_only_inside_an_analysis() -> None:
    assert compat.fake_cuda_needs_help() == (compat.torch_release() < (2, 10))
    assert driverless_29.problem() is None  # every slot it uses holds the function it says
    chooser = torch._C._select_conv_backend
    undo = driverless_29.install()
    # The SDPA stand-in exists exactly where the help was given, and only until the undo.
    assert bool(driverless_29.STAND_INS) == compat.fake_cuda_needs_help()
    assert (torch._C._select_conv_backend is chooser) != compat.fake_cuda_needs_help()
    undo()
    assert driverless_29.STAND_INS == {} and torch._C._select_conv_backend is chooser


def test_a_bf16_convolution_needs_no_driver() -> None:
    """Fake tensors ask ``_select_conv_backend`` for a convolution's memory format; its cuDNN
    checks for bf16 read the device's properties. Without a device the choice leaves cuDNN
    (2.10 on by itself), and the real autocast kernel's dtype comes out."""
    out = _run("""
with fake_mode():
    x = torch.empty(1, 3, 4, 4, device="cuda", dtype=torch.bfloat16)
    w = torch.empty(4, 3, 1, 1, device="cuda", dtype=torch.bfloat16)
    print(torch._C._select_conv_backend(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, None))
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", torch.bfloat16)
    print(torch.nn.functional.conv2d(x.float(), w.float(), torch.empty(4, device="cuda")).dtype)
""")
    assert out.split() == ["_ConvBackend.Slow2d", "torch.bfloat16"]


_ON_2_9 = pytest.mark.skipif(
    not compat.fake_cuda_needs_help(), reason="the driverless guard is built on torch 2.9 only"
)
_LIBC10 = Path(torch.__file__).parent / "lib" / "libc10.so"


def _registry() -> ctypes.Array[ctypes.c_size_t]:
    """libc10's device-guard registry, one C++ object address per device type."""
    libc10 = ctypes.CDLL(str(_LIBC10))
    first = ctypes.c_size_t.in_dll(libc10, "_ZN3c104impl26device_guard_impl_registryE")
    return (ctypes.c_size_t * 15).from_address(ctypes.addressof(first))


def _guard(device_type: int) -> tuple[int, list[int], bytes]:
    """The registered guard's vtable address point, its 23 slots and its class's RTTI name."""
    vtable = ctypes.c_size_t.from_address(_registry()[device_type]).value
    type_info = ctypes.c_size_t.from_address(vtable - 8).value
    name = ctypes.string_at(ctypes.c_size_t.from_address(type_info + 8).value)
    return vtable, list((ctypes.c_size_t * 23).from_address(vtable)), name


@_ON_2_9
def test_the_slots_used_hold_what_the_libraries_symbol_tables_name_them() -> None:
    """Each slot the guard is built from is read back by name from the library that holds it
    (libc10_cuda's CUDAGuardImpl, libtorch_cpu's NoOpDeviceGuardImpl<Meta>), with the size of
    each vtable; two slots swapped, another class's table, a table off by one slot or a copy
    outside the library are refused, each for what is wrong with it."""
    cuda, meta = _guard(1), _guard(14)
    assert driverless_29.vtable_problem(*cuda) is None
    assert driverless_29.vtable_problem(*meta) is None
    vtable, slots, name = meta
    for first, second, member in ((1, 14, "11deviceCountEv"), (2, 3, "9setDeviceENS_6DeviceE")):
        swapped = list(slots)
        swapped[first], swapped[second] = swapped[second], swapped[first]
        why = driverless_29.vtable_problem(vtable, swapped, name)
        assert why is not None and why.startswith(f"slot {first} holds ") and member in why
    copy = (ctypes.c_size_t * 25)(0, 0, *slots)
    for table, held, said in (
        (cuda[0], slots, name),  # CUDA's table, said to be meta's
        (vtable + 8, [*slots[1:], 0], name),  # meta's, read one slot on
        (ctypes.addressof(copy) + 16, slots, name),  # the same words, not in a library
    ):
        assert driverless_29.vtable_problem(table, held, said) == (
            f"no vtable of {name.decode()} with 23 slots at {table:#x}"
        )


@_ON_2_9
def test_a_layout_the_library_does_not_have_is_refused_with_nothing_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shim built for a header with deviceCount and exchangeDevice the other way round finds
    the library disagrees: one warning saying what to install (once per process), and the
    registry, ``torch._C`` and the stand-ins as they were."""
    members = dict(driverless_29._MEMBERS)
    members[1], members[14] = members[14], members[1]
    monkeypatch.setattr(driverless_29, "_MEMBERS", members)
    monkeypatch.setattr(driverless_29, "_WHY", {})
    driverless_29._guards_problem.cache_clear()
    before = (_registry()[1], torch._C._select_conv_backend)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            undos = [driverless_29.install(), driverless_29.install()]
        assert len(caught) == 1 and issubclass(caught[0].category, compat.UnsupportedVersionWarning)
        assert "(slot 1 holds " in str(caught[0].message)
        assert str(caught[0].message).endswith("pip install 'torch>=2.10'")
        assert (_registry()[1], torch._C._select_conv_backend) == before
        assert driverless_29.STAND_INS == {}
        assert (driverless_29.problem() or "").startswith("slot 1 holds ")
        for undo in undos:
            undo()
    finally:
        monkeypatch.undo()
        driverless_29._guards_problem.cache_clear()
    assert driverless_29.problem() is None  # the layout the library has


def test_a_library_without_a_symbol_table_cannot_name_a_slot(tmp_path: Path) -> None:
    """A stripped build (no ``.symtab``, emulated by marking that section unused in a copy of
    libc10.so) answers LookupError, which the check reports as its refusal; the library as
    shipped has its table."""
    data = bytearray(_LIBC10.read_bytes())
    (offset,) = struct.unpack_from("<Q", data, 0x28)
    size, count = struct.unpack_from("<HH", data, 0x3A)
    types = [offset + i * size + 4 for i in range(count)]  # each section header's sh_type
    symtab = [at for at in types if struct.unpack_from("<I", data, at)[0] == 2]  # SHT_SYMTAB
    assert len(symtab) == 1
    struct.pack_into("<I", data, symtab[0], 0)  # SHT_NULL: what strip leaves of it
    stripped = tmp_path / "libc10.so"
    stripped.write_bytes(data)
    assert elf_symbols.symbols_in(str(_LIBC10), [0]) == {}
    with pytest.raises(LookupError, match="has no symbol table"):
        elf_symbols.symbols_in(str(stripped), [0])
