"""torch 2.9 without a GPU driver: what torch 2.10 does for fake CUDA tensors by itself, done here.

ampgraph runs the real CUDA autocast kernels on fake CUDA tensors (DESIGN.md fact 3). On a CUDA
build of torch 2.9 with no driver, three C++ paths that never look at a tensor's data still ask the
driver, and models stop on them (``compat.fake_cuda_needs_help`` names the releases):

* **The CUDA device guard.** C++ code asks the registered ``DeviceGuardImplInterface`` for CUDA
  (``c10/cuda/impl/CUDAGuardImpl.h``) for the current device and stream: autograd's
  ``InputMetadata`` constructor (``torch/csrc/autograd/input_metadata.cpp``: ``getStream``, on
  the first op on a parameter that requires grad; ``getStream`` is ``noexcept``, so the driver's
  error ends the process, SIGABRT), Python indexing's ``OptionalDeviceGuard``
  (``THPVariable_getitem``: ``exchangeDevice`` -> ``CUDA driver version is insufficient``), and
  ``.to("cuda")``'s ``ensure_has_index``. torch 2.10 swaps that guard for a driverless one
  (``c10::impl::ensureCUDADeviceGuardSet``, called by ``FakeTensorMode.__enter__`` through
  ``torch._C._ensureCUDADeviceGuardSet`` where the CUDA guard counts no device; its
  ``FakeGuardImpl<CUDA>`` answers device ``cuda:0`` and never calls CUDA). torch 2.9 has neither
  the function nor its binding. :func:`install` puts the same kind of guard in the same registry
  slot (``c10::impl::device_guard_impl_registry``, exported by ``libc10.so``), built from code
  already in the process: the no-op guard torch registers for ``meta`` with ``type()``,
  ``getDevice()`` and ``exchangeDevice()`` answered by ``CUDAGuardImpl::type``, whose machine code
  (``mov eax, 1; ret``) is checked to return ``Device(cuda, 0)``; ``deviceCount()`` stays CUDA's
  own (0). Nothing in it touches a dtype: it only stops the driver being asked.
* **scaled_dot_product_attention.** Its CUDA composite chooses a backend
  (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``: ``select_sdp_backend``), and the
  flash, memory-efficient and cuDNN checks read the device's properties
  (``at::cuda::getCurrentDeviceProperties`` -> ``c10::cuda::current_device``). torch 2.10 catches
  that error in ``select_sdp_backend`` and takes the math backend; 2.9 raises. The stand-in
  (:data:`STAND_INS`) runs the composite with only the math backend enabled, for CUDA inputs
  only: the graphs it gives on 2.9 are the ones 2.10 gives (fp16, bf16 and fp32; causal,
  dropout, grouped-query and masked calls compared node for node).
* **The convolution backend choice** fake tensors ask for (``torch._C._select_conv_backend``,
  for the output's memory format): cuDNN's bf16 and depthwise checks read the device's
  properties; 2.10 takes them as unsupported, and so does the replacement (the same backend
  and memory format as 2.10 for 2d, 3d, 1d, transposed and depthwise calls in fp32, bf16, fp16).

**Why it stays.** Users of torch 2.9 on a CUDA build without a GPU (a CI runner, a laptop: the
machines ampgraph is for, often pinned to the torch of the GPU image they train with) need the
CUDA settings, the default ones; refusing 2.9 there would leave them only the CPU settings, and
the meta replay of a CPU-only build types trace-time reads less exactly (DESIGN.md fact 5). It
runs inside an analysis only (:mod:`ampgraph.capture.environment` enters it and puts the
registry slot and ``torch._C._select_conv_backend`` back on exit), and since every assumption
below is read back from the loaded libraries, a library it does not fit is refused, not guessed.

**What it checks**, before it writes anything (:func:`problem` says which check failed; the
answer is the libraries', so it is asked once per process):

* the machine is x86-64 Linux (the two ABIs below); ``libc10.so`` exports the registry, and
  CUDA and meta have guards in it;
* the two guards' RTTI names are ``c10::cuda::impl::CUDAGuardImpl`` and
  ``c10::impl::NoOpDeviceGuardImpl<Meta>``;
* **the slot positions and the size of each vtable, by name**
  (:func:`vtable_problem`): ``dladdr`` names only exported symbols and these member functions
  are local, but the libraries' full symbol tables (``.symtab``, which torch's Linux wheels
  keep; :mod:`~ampgraph.capture.elf_symbols` reads them) name the table each guard points to
  ``_ZTV`` + its class, 200 bytes long (two header words and 23 slots: the copy is the whole
  table and no more), and slots 0, 1, 2 and 14 the class's own ``type``, ``exchangeDevice``,
  ``getDevice`` and ``deviceCount``. A library without a symbol table is refused;
* ``CUDAGuardImpl::type``'s machine code is ``mov eax, 1; ret`` (six bytes);
* CUDA's ``deviceCount``, called through its own signature on CUDA's own guard, answers what
  ``torch.cuda.device_count()`` does (0).

Where any check fails, nothing is changed and one warning says to install ``torch>=2.10``.

**What remains outside C++'s rules**, and what defines it instead: the Itanium C++ ABI and the
x86-64 System V ABI (those of torch 2.9's Linux wheels; the machine is checked above), with the
machine code checked above. (1) The guard is an object C++ never constructed: one vtable pointer, to a
copy of meta's table. Under the Itanium ABI an object of a polymorphic class without data
members is its vtable pointer, and a virtual call loads its slot from the table that pointer
points to; neither guard class has data members, so no function reads more of ``this``
(``CUDAGuardImpl::type`` reads nothing, ``deviceCount`` jumps to ``c10::cuda::device_count``).
(2) ``CUDAGuardImpl::type`` (``DeviceType type() const``) sits in the ``getDevice`` and
``exchangeDevice(Device)`` slots: C++ calls a call through another function type undefined, but
what runs is the six bytes checked, which set ``eax`` to 1 whatever ``rdi`` and ``rsi`` hold, and
the System V ABI returns a ``Device`` (two bytes, trivially copyable) in ``ax``: ``{CUDA, 0}``,
what 2.10's ``FakeGuardImpl<CUDA>`` answers. The alternatives were weighed: torch 2.9 binds no
way to set a device guard from Python (2.10 added ``torch._C._ensureCUDADeviceGuardSet``);
``ctypes`` callbacks of the exact signatures would enter Python from whichever C++ thread asks
the guard, taking the GIL inside C++ code that may hold its own locks (a deadlock where the
GIL's holder waits for one), where six checked bytes neither leave C++ nor lock; a C++
extension built at analysis time would need a compiler and torch's headers on the user's
machine.

Only where needed: torch older than 2.10, a CUDA build, and no CUDA device (the guard's own
count). With a GPU, or on any other release, :func:`install` does nothing. Backward on fake CUDA
tensors fails on 2.10 too (``hasPrimaryContext``); ampgraph differentiates on meta (fact 11).

>>> undo = install()  # what ampgraph.capture.environment does on entering an analysis
>>> undo()  # and on leaving it: the registry slot and torch._C are as they were
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Final

import torch

from ampgraph.capture import elf_symbols
from ampgraph.capture.elf_symbols import Symbol
from ampgraph.capture.scoped_library import ScopedLibrary
from ampgraph.compat import UnsupportedVersionWarning, fake_cuda_needs_help

aten = torch.ops.aten

#: ``c10::DeviceType`` values (``c10/core/DeviceType.h``) of the registry slots read here.
_CUDA, _META = 1, 14
#: Slots of ``DeviceGuardImplInterface``'s vtable (declaration order, ``c10/core/impl/
#: DeviceGuardImplInterface.h`` of 2.9): type, exchangeDevice, getDevice, deviceCount.
_TYPE, _EXCHANGE_DEVICE, _GET_DEVICE, _DEVICE_COUNT = 0, 1, 2, 14
_SLOTS: Final = 23  # 21 virtual functions, and the destructor's two entries
#: The member function each slot used here must hold: its name as the Itanium ABI mangles it,
#: after ``_ZNK`` and the class's nested name (in ``NS_6DeviceE``, ``S_`` is ``c10::``).
_MEMBERS: Final = {
    _TYPE: "4typeEv",
    _EXCHANGE_DEVICE: "14exchangeDeviceENS_6DeviceE",
    _GET_DEVICE: "9getDeviceEv",
    _DEVICE_COUNT: "11deviceCountEv",
}
#: RTTI names (``typeid(...).name()``) of the two guards the new one is made from.
_CUDA_GUARD: Final = b"N3c104cuda4impl13CUDAGuardImplE"
_META_GUARD: Final = b"N3c104impl19NoOpDeviceGuardImplILNS_10DeviceTypeE14EEE"
#: ``CUDAGuardImpl::type()``: ``mov eax, 1; ret``. As a ``Device`` (two bytes, type then index,
#: returned in ``ax``) that is ``cuda:0``.
_RETURNS_CUDA_0: Final = bytes.fromhex("b801000000c3")


def _vtable(obj: int) -> tuple[int, bytes]:
    """The vtable address of the C++ object at ``obj`` and its class's RTTI name."""
    vtable = ctypes.c_void_p.from_address(obj).value or 0
    type_info = ctypes.c_void_p.from_address(vtable - 8).value or 0
    return vtable, ctypes.string_at(ctypes.c_void_p.from_address(type_info + 8).value or 0)


def _slots(vtable: int) -> list[int]:
    """The function addresses in the vtable at ``vtable`` (its address point)."""
    return list((ctypes.c_size_t * _SLOTS).from_address(vtable))


def vtable_problem(vtable: int, slots: Sequence[int], rtti: bytes) -> str | None:
    """Why ``slots`` are not what the shim takes the vtable of the class ``rtti`` names to be
    (None: they are), by the symbol table of the library that holds them
    (:mod:`~ampgraph.capture.elf_symbols`): the table at ``vtable`` is that class's vtable
    (``_ZTV`` + ``rtti``) of two header words and :data:`_SLOTS` slots, and slots 0, 1, 2 and 14
    hold the class's own ``type``, ``exchangeDevice``, ``getDevice`` and ``deviceCount``. Reads
    only; ``slots`` may be a copy (the tests give it a doctored one).

    >>> vtable_problem(0, [0] * 23, _CUDA_GUARD)
    'no vtable of N3c104cuda4impl13CUDAGuardImplE with 23 slots at 0x0'
    """
    cls = rtti.decode()
    try:
        found = elf_symbols.symbols_at([vtable - 16, *(slots[slot] for slot in _MEMBERS)])
    except LookupError as exc:
        return str(exc)
    if Symbol(f"_ZTV{cls}", (_SLOTS + 2) * 8) not in found.get(vtable - 16, []):
        return f"no vtable of {cls} with {_SLOTS} slots at {vtable:#x}"
    for slot, member in _MEMBERS.items():
        want = f"_ZNK{cls[1:-1]}{member}"
        held = [symbol.name for symbol in found.get(slots[slot], [])]
        if want not in held:
            return f"slot {slot} holds {', '.join(held) or 'no named function'}, not {want}"
    return None


@functools.cache
def _guards_problem(cuda_guard: int, meta_guard: int) -> str | None:
    """Why the registered guards are not those the new guard can be built from (None: they
    are), asked once per pair of objects (the answer is the libraries')."""
    cuda_vtable, cuda_name = _vtable(cuda_guard)
    meta_vtable, meta_name = _vtable(meta_guard)
    if cuda_name != _CUDA_GUARD or meta_name != _META_GUARD:
        return f"unexpected device guards ({cuda_name!r}, {meta_name!r})"
    for vtable, name in ((cuda_vtable, cuda_name), (meta_vtable, meta_name)):
        if (why := vtable_problem(vtable, _slots(vtable), name)) is not None:
            return why
    cuda = _slots(cuda_vtable)
    if ctypes.string_at(cuda[_TYPE], len(_RETURNS_CUDA_0)) != _RETURNS_CUDA_0:
        return "CUDAGuardImpl::type() is not the code this relies on"
    # Its own signature (``DeviceIndex deviceCount() const noexcept``) on its own object.
    count = ctypes.CFUNCTYPE(ctypes.c_int8, ctypes.c_void_p)(cuda[_DEVICE_COUNT])(cuda_guard)
    if count != torch.cuda.device_count():
        return f"CUDAGuardImpl::deviceCount() is {count}, not {torch.cuda.device_count()}"
    return None


def _install_cuda_guard(kept: list[Any]) -> tuple[str | None, Callable[[], None]]:
    """Put a driverless CUDA guard in the registry: (None, how to put the old one back), or
    (why not, a no-op) with nothing changed."""
    if platform.machine() != "x86_64" or sys.platform != "linux":  # the ABI the calls rely on
        return f"{sys.platform} on {platform.machine()} is not x86-64 Linux", _nothing
    libc10 = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
    try:
        first = ctypes.c_void_p.in_dll(libc10, "_ZN3c104impl26device_guard_impl_registryE")
    except ValueError:
        return "libc10.so does not export c10::impl::device_guard_impl_registry", _nothing
    registry = (ctypes.c_void_p * (_META + 1)).from_address(ctypes.addressof(first))
    if not registry[_CUDA] or not registry[_META]:
        return "no CUDA or meta device guard registered (a CPU-only build of torch?)", _nothing
    if (why := _guards_problem(registry[_CUDA], registry[_META])) is not None:
        return why, _nothing
    cuda = _slots(_vtable(registry[_CUDA])[0])
    meta_vtable = _vtable(registry[_META])[0]
    # The meta guard's vtable with its two header words (offset to top, RTTI), then CUDA's answers.
    table = (ctypes.c_size_t * (_SLOTS + 2)).from_buffer_copy(
        ctypes.string_at(meta_vtable - 16, (_SLOTS + 2) * 8)
    )
    for slot in (_TYPE, _EXCHANGE_DEVICE, _GET_DEVICE):
        table[2 + slot] = cuda[_TYPE]
    table[2 + _DEVICE_COUNT] = cuda[_DEVICE_COUNT]
    guard = ctypes.c_void_p(ctypes.addressof(table) + 16)  # the object: one vtable pointer
    kept.extend([table, guard])  # the registry holds a raw pointer into them while installed
    original = registry[_CUDA]
    registry[_CUDA] = ctypes.addressof(guard)

    def undo() -> None:
        registry[_CUDA] = original

    return None, undo


def _nothing() -> None:
    """Nothing to undo."""


def _sdpa(*args: Any, **kwargs: Any) -> Any:
    """``scaled_dot_product_attention``'s composite with the math backend alone, for CUDA
    inputs (what 2.10 chooses without a driver); any other input takes the composite as is."""
    composite = aten.scaled_dot_product_attention.default._op_dk
    key = torch._C.DispatchKey.CompositeImplicitAutograd
    if args[0].device.type != "cuda":
        return composite(key, *args, **kwargs)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        return composite(key, *args, **kwargs)


_SELECT_CONV_BACKEND: Final = torch._C._select_conv_backend


def _select_conv_backend(*args: Any, **kwargs: Any) -> Any:
    """``torch._C._select_conv_backend``, which fake tensors call for a convolution's memory
    format (``fake_impls.conv``), as 2.10 answers it without a device: cuDNN's bf16 and
    depthwise checks ask the device's properties (``CUDAHooks::supportsBFloat16ConvolutionWith
    CuDNNv8``: the driver's error on 2.9), which 2.10 reads as "not supported", so the choice
    goes on without cuDNN. Only the output's memory format depends on it, never a dtype."""
    try:
        return _SELECT_CONV_BACKEND(*args, **kwargs)
    except RuntimeError as exc:
        if "CUDA driver" not in str(exc):
            raise
    with torch.backends.cudnn.flags(enabled=False):
        return _SELECT_CONV_BACKEND(*args, **kwargs)


#: op -> its stand-in while :func:`install` is in effect (``driverless.decomposition`` reads it).
STAND_INS: dict[torch._ops.OpOverload, Callable[..., Any]] = {}
#: Why the guard could not be installed on this machine (None: it can, or is not needed); asked
#: once, since the answer is the library's.
_WHY: dict[str, str | None] = {}


def _register_stand_ins() -> Callable[[], None]:
    """The SDPA stand-in at ``AutogradCUDA``, where the composite runs, and the convolution
    backend choice fake tensors ask for (no GPU here for either to affect), until the returned
    function runs."""
    lib = ScopedLibrary("aten")  # destroyed by the undo
    lib.impl("scaled_dot_product_attention", _sdpa, "AutogradCUDA")
    STAND_INS[aten.scaled_dot_product_attention.default] = _sdpa
    torch._C._select_conv_backend = _select_conv_backend  # looked up by fake_impls at each call

    def undo() -> None:
        torch._C._select_conv_backend = _SELECT_CONV_BACKEND
        STAND_INS.clear()
        lib.destroy()

    return undo


def needed() -> bool:
    """Whether this process needs the shim: torch older than 2.10, a CUDA build, no CUDA device.

    >>> needed() == (fake_cuda_needs_help() and bool(torch.version.cuda)
    ...              and torch.cuda.device_count() == 0)
    True
    """
    return bool(fake_cuda_needs_help() and torch.version.cuda and torch.cuda.device_count() == 0)


def install() -> Callable[[], None]:
    """Make fake CUDA tensors work without a driver on torch 2.9, until the returned function
    runs (:mod:`ampgraph.capture.environment` calls both); elsewhere nothing. Where an assumption
    fails (:func:`problem` says which), nothing is changed and one warning says what to install:
    the analysis of CUDA settings then stops where torch asks the driver."""
    if not needed():
        return _nothing
    kept: list[Any] = []
    why, undo_guard = _install_cuda_guard(kept)
    if why is not None:
        if "warned" not in _WHY:
            _WHY["warned"] = why
            warnings.warn(
                f"torch {torch.__version__} without a GPU driver: fake CUDA tensors need a device "
                f"guard ampgraph could not install ({why}); pip install 'torch>=2.10'",
                UnsupportedVersionWarning,
                stacklevel=2,
            )
        return _nothing
    undo_stand_ins = _register_stand_ins()

    def undo() -> None:
        undo_stand_ins()
        undo_guard()
        kept.clear()

    return undo


def problem() -> str | None:
    """Why the shim cannot be installed here (None: it can, or is not needed); changes nothing.

    >>> problem() is None or isinstance(problem(), str)
    True
    """
    if not needed():
        return None
    kept: list[Any] = []
    why, undo = _install_cuda_guard(kept)
    undo()
    return why


__all__ = ["STAND_INS", "install", "needed", "problem", "vtable_problem"]
