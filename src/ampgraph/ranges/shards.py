"""safetensors shards read with the rules every ampgraph input is read by, one tensor at a time.

A model folder's ``*.safetensors`` files are data someone handed us, so they are read as the
project's one reader (:mod:`ampgraph.report.reading`) reads a report: a regular file only (a FIFO,
``/dev/zero``, a folder named ``x.safetensors``, a dangling link or a loop is one line), opened
without waiting on a FIFO, every size checked before anything is allocated. The format (a
little-endian u64 header length, a JSON header, then the tensors' bytes) is parsed here rather
than by ``safetensors.safe_open``, whose errors are thirty-line tracebacks and which maps whatever
the path names: the header is read from the fd that was checked, every entry validated (a known
dtype, a shape whose values fill exactly its byte range, ranges inside the file and not
overlapping), and each tensor is read with ``pread`` into memory of its own checked size.

Each refusal is one :class:`~ampgraph.errors.FileReadError` line naming the file and what is wrong.

>>> import tempfile, pathlib, torch
>>> from safetensors.torch import save_file
>>> path = pathlib.Path(tempfile.mkdtemp()) / "model.safetensors"
>>> save_file({"w": torch.arange(6.0).reshape(2, 3)}, str(path))
>>> with Shard(path) as shard:
...     shard.entries["w"].dtype, shard.entries["w"].shape, shard.read("w").sum().item()
('F32', (2, 3), 15.0)
>>> _ = path.write_bytes((2**63).to_bytes(8, "little"))
>>> Shard(path)                                                   # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ampgraph.errors.FileReadError: cannot read the safetensors file ...: its header length is 9223372036854775808 bytes, ...
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from ampgraph.errors import FileReadError
from ampgraph.report.reading import open_regular, size_text

#: safetensors' dtype names -> torch's, as data (safetensors' own torch bindings keep the same
#: table); a name this torch lacks is refused as unknown.
DTYPES: dict[str, str] = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64",
    "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
    "C64": "complex64", "C128": "complex128",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
}  # fmt: skip
#: The longest header safetensors itself accepts (its ``MAX_HEADER_SIZE``).
MAX_HEADER = 100_000_000
WHAT = "safetensors file"


def safetensors_dtype(name: str) -> torch.dtype | None:
    """The torch dtype of a safetensors dtype name, or None where it is not one this torch has.

    >>> safetensors_dtype("BF16"), safetensors_dtype("F4")
    (torch.bfloat16, None)
    """
    found = getattr(torch, DTYPES.get(name, ""), None)
    return found if isinstance(found, torch.dtype) else None


@dataclass(frozen=True)
class Entry:
    """One tensor of a shard's header: its dtype (safetensors' name), shape and byte range
    (relative to the end of the header)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


class Shard:
    """One safetensors file, open and validated: ``entries`` by name, :meth:`read` one tensor.

    A context manager (the fd is closed on leaving); every error is one :class:`FileReadError`.
    """

    def __init__(self, path: Path | str, what: str = WHAT) -> None:
        self.path = Path(path)
        self.what = what
        self.fd = open_regular(self.path, what)
        try:
            self.size = os.fstat(self.fd).st_size
            self.start, self.entries = self._header()
        except BaseException:
            os.close(self.fd)
            raise

    def __enter__(self) -> Shard:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def refuse(self, problem: str, todo: str = "it is not a safetensors file ampgraph can read"
               ) -> FileReadError:  # fmt: skip
        """The one-line error about this file."""
        shown = str(self.path) if len(str(self.path)) <= 200 else f"{str(self.path)[:200]}\u2026"
        return FileReadError(f"cannot read the {self.what} {shown}: {problem}; {todo}")

    def _pread(self, size: int, offset: int) -> bytearray:
        """Exactly ``size`` bytes at ``offset`` (``size`` already checked against the file)."""
        buf = bytearray(size)
        view, done = memoryview(buf), 0
        try:
            while done < size:
                got = os.preadv(self.fd, [view[done:]], offset + done)
                if got == 0:
                    raise self.refuse(f"it ended at byte {offset + done:,} while being read",
                                      "was it changed while ampgraph read it?")  # fmt: skip
                done += got
        except OSError as exc:
            raise self.refuse(exc.strerror or type(exc).__name__, "check the file") from None
        return buf

    def _header(self) -> tuple[int, dict[str, Entry]]:
        if self.size < 8:
            raise self.refuse(f"it is {self.size} bytes, less than the 8 of a safetensors "
                              "header's length")  # fmt: skip
        length = int.from_bytes(self._pread(8, 0), "little")
        if length > MAX_HEADER:
            raise self.refuse(f"its header length is {length} bytes, more than the "
                              f"{size_text(MAX_HEADER)} safetensors allows")  # fmt: skip
        if 8 + length > self.size:
            raise self.refuse(f"its header length is {length:,} bytes, but only "
                              f"{self.size - 8:,} follow it (the file is cut short?)")  # fmt: skip
        raw = bytes(self._pread(length, 8))
        try:
            header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates,
                                parse_constant=_no_constant)  # fmt: skip
        except (ValueError, RecursionError) as exc:
            problem = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise self.refuse(f"its header is not JSON ({problem[:200]})") from None
        if not isinstance(header, dict):
            raise self.refuse(f"its header is JSON {type(header).__name__}, not an object")
        data = self.size - 8 - length
        entries = {k: self._entry(k, v, data) for k, v in header.items() if k != "__metadata__"}
        ordered = sorted(entries.values(), key=lambda e: (e.begin, e.end))
        for a, b in zip(ordered, ordered[1:]):
            if b.begin < a.end:
                raise self.refuse(f"the bytes of {_name(b.name)} ({b.begin:,} to {b.end:,}) "
                                  f"overlap those of {_name(a.name)} ({a.begin:,} to {a.end:,})")
        return 8 + length, entries

    def _entry(self, name: str, info: Any, data: int) -> Entry:
        """One header entry checked: every number is a Python int, so nothing overflows here."""
        what = f"the header's entry {_name(name)}"
        if not isinstance(info, dict):
            raise self.refuse(f"{what} is {type(info).__name__}, not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        torch_type = safetensors_dtype(dtype) if isinstance(dtype, str) else None
        if torch_type is None:
            raise self.refuse(f"{what} has the dtype {str(dtype)[:40]!r}, which this ampgraph and "
                              f"torch {torch.__version__} do not know")  # fmt: skip
        if not _ints(shape):
            raise self.refuse(f"{what} has the shape {str(shape)[:80]}, not a list of sizes >= 0")
        if not _ints(offsets) or len(offsets) != 2 or offsets[0] > offsets[1]:
            raise self.refuse(f"{what} has data_offsets {str(offsets)[:80]}, not [begin, end] "
                              "with 0 <= begin <= end")  # fmt: skip
        begin, end = offsets
        if end > data:
            raise self.refuse(f"{what} ends at byte {end:,} of the data, past its end "
                              f"({data:,} bytes)")  # fmt: skip
        count = math.prod(shape)
        need = count * torch_type.itemsize
        if need != end - begin:
            raise self.refuse(f"{what} has the shape {str(shape)[:80]}, which holds {count:,} "
                              f"{dtype} values ({need:,} bytes), but its data is {end - begin:,} "
                              "bytes")  # fmt: skip
        return Entry(name, dtype, tuple(shape), begin, end)

    def read(self, name: str) -> torch.Tensor:
        """The tensor ``name``, read into memory of its own (checked) size."""
        entry = self.entries[name]
        dtype = safetensors_dtype(entry.dtype)
        assert dtype is not None  # checked in _entry
        if entry.end == entry.begin:
            return torch.empty(entry.shape, dtype=dtype)
        buf = self._pread(entry.end - entry.begin, self.start + entry.begin)
        # safetensors is little-endian, as every machine ampgraph runs on.
        return torch.frombuffer(buf, dtype=dtype).reshape(entry.shape)


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    )


def _name(name: str) -> str:
    return repr(name if len(name) <= 120 else f"{name[:120]}\u2026")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"the name {_name(key)} is there twice")
        seen[key] = value
    return seen


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


__all__ = ["DTYPES", "MAX_HEADER", "Entry", "Shard", "safetensors_dtype"]
