"""What the shared libraries of this process call an address: their ELF symbol tables, read.

``dladdr`` names an address only by the library's exported symbols (``.dynsym``). The member
functions and vtables of a class that a library keeps to itself (torch's device guards among
them) are local symbols, named only in the full symbol table (``.symtab``), which linkers write
and torch's Linux wheels keep (``file libc10.so``: "not stripped"). This module finds the library
that maps an address (``dladdr``: its file and where it is loaded), reads that file's ``.symtab``
and returns every symbol defined at the address, with its size. ``capture/driverless_29.py``
checks with it that each vtable slot it uses holds the member function it assumes, by name.

Only 64-bit little-endian ELF on Linux, the only kind torch 2.9's wheels that need it are; a
library without a ``.symtab`` (stripped) answers :class:`LookupError`, so a caller refuses rather
than guesses. Reading is ``mmap``: of a 400 MB ``libtorch_cpu.so`` only its symbol table (13 MB)
and the few names asked for are read, about 0.1 s.

>>> import ctypes
>>> import os
>>> import torch
>>> libc10 = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
>>> name = "_ZN3c104impl26device_guard_impl_registryE"
>>> registry = ctypes.addressof(ctypes.c_void_p.in_dll(libc10, name))
>>> [s.name for s in symbols_at([registry])[registry]] == [name]
True
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import struct
from collections.abc import Iterable
from typing import Any, Final, NamedTuple

#: ELF64 layouts (``elf.h``): a section header, a program header, a symbol-table entry.
_SECTION: Final = struct.Struct("<IIQQQQIIQQ")  # name type flags addr offset size link info ...
_PROGRAM: Final = struct.Struct("<IIQQQQQQ")  # type flags offset vaddr paddr filesz memsz align
_SYMBOL: Final = struct.Struct("<IBBHQQ")  # name info other shndx value size
_SHT_SYMTAB, _PT_LOAD = 2, 1
#: Symbols that name an address (``STT_NOTYPE``, ``STT_OBJECT``, ``STT_FUNC``), not a source file,
#: a section or a thread-local offset; in a section of the file (not undefined, absolute, common).
_ADDRESS_TYPES: Final = frozenset({0, 1, 2})
_NO_SECTION: Final = frozenset({0, 0xFFF1, 0xFFF2})


class Symbol(NamedTuple):
    """One entry of a library's symbol table: its (mangled) name and its size in bytes."""

    name: str
    size: int


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("fname", ctypes.c_char_p),
        ("fbase", ctypes.c_void_p),
        ("sname", ctypes.c_char_p),
        ("saddr", ctypes.c_void_p),
    ]


@functools.cache
def _dladdr() -> Any:
    """glibc's ``dladdr``, typed."""
    dladdr = ctypes.CDLL(None).dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    return dladdr


def _library_of(address: int) -> tuple[str, int] | None:
    """The file of the shared object that maps ``address`` and the address its first segment is
    loaded at (``dladdr``); None where no loaded object maps it (the heap, a doctored table)."""
    info = _DlInfo()
    if address <= 0 or not _dladdr()(address, ctypes.byref(info)) or not info.fname:
        return None
    return info.fname.decode(), info.fbase or 0


@functools.cache
def _layout(path: str) -> tuple[int, int, int, int]:
    """Where ``path``'s ``.symtab`` lies in the file (offset, size), where the string table of
    its names starts, and the first loaded segment's page-aligned address, the one ``dladdr``'s
    base is the load address of; LookupError without a symbol table."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as elf:
        if elf[:6] != b"\x7fELF\x02\x01":  # 64-bit, little-endian
            raise LookupError(f"{path} is not a 64-bit little-endian ELF file")
        (phoff,) = struct.unpack_from("<Q", elf, 0x20)
        (shoff,) = struct.unpack_from("<Q", elf, 0x28)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", elf, 0x36)
        loads = [
            header[3]
            for i in range(phnum)
            if (header := _PROGRAM.unpack_from(elf, phoff + i * phentsize))[0] == _PT_LOAD
        ]
        sections = [_SECTION.unpack_from(elf, shoff + i * shentsize) for i in range(shnum)]
    tables = [s for s in sections if s[1] == _SHT_SYMTAB]
    if not tables:
        raise LookupError(f"{path} has no symbol table (stripped)")
    if not loads:
        raise LookupError(f"{path} has no segment to load")
    names = sections[tables[0][6]]  # sh_link: the string table of its names
    return tables[0][4], tables[0][5], names[4], min(loads) & ~(mmap.PAGESIZE - 1)


def symbols_in(path: str, offsets: Iterable[int]) -> dict[int, list[Symbol]]:
    """Every symbol the ELF file ``path`` defines at each of ``offsets`` (addresses as the file
    gives them, before loading); an offset no symbol starts at is left out. LookupError where
    the file has no ``.symtab``.

    >>> import os
    >>> import torch
    >>> path = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
    >>> symbols_in(path, [0])  # the file's header: no symbol starts there
    {}
    """
    symtab, size, strtab, _ = _layout(path)
    wanted = set(offsets)
    found: dict[int, list[Symbol]] = {}
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as elf:
        table = elf[symtab : symtab + size]
        for name, info, _, section, value, length in _SYMBOL.iter_unpack(table):
            if value in wanted and (info & 0xF) in _ADDRESS_TYPES and section not in _NO_SECTION:
                text = elf[strtab + name : elf.find(b"\0", strtab + name)].decode()
                found.setdefault(value, []).append(Symbol(text, length))
    return found


def symbols_at(addresses: Iterable[int]) -> dict[int, list[Symbol]]:
    """Every symbol the symbol tables of this process's libraries define at each address (an
    address no library maps, or no symbol starts at, is left out). LookupError where a library
    that maps one of them has no ``.symtab``, so nothing can be said of it."""
    by_library: dict[tuple[str, int], set[int]] = {}
    for address in set(addresses):
        if (library := _library_of(address)) is not None:
            by_library.setdefault(library, set()).add(address)
    found: dict[int, list[Symbol]] = {}
    for (path, base), wanted in by_library.items():
        bias = base - _layout(path)[3]  # what the library's addresses are moved by when loaded
        for offset, symbols in symbols_in(path, {address - bias for address in wanted}).items():
            found[offset + bias] = symbols
    return found


__all__ = ["Symbol", "symbols_at", "symbols_in"]
