"""Writing files the way every ampgraph output is written: atomically, readable like any document.

Torch-free, so the cache, the renderer and verify's records share it.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
>>> atomic_write(path, b"hello")
>>> path.read_text(), oct(path.stat().st_mode & 0o777) in ("0o644", "0o664", "0o600")
('hello', True)
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from ampgraph.errors import AmpgraphError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: Path, data: bytes, *, mode: int = 0o666) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never half.

    A temporary file in the same folder is renamed over ``path``. ``mkstemp`` makes it private
    (0600); the result gets ``mode`` less the umask, as ``open()`` would have given it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def check_writable(path: Path, what: str = "output") -> None:
    """Fail in one line, before any work, if ``path`` cannot be written where it is.

    >>> check_writable(Path("/proc/version/x"), "record")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ampgraph.errors.AmpgraphError: cannot write the record to /proc/version/x: ...
    """
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    problem = None
    if path.is_dir():
        problem = "it is a folder"
    elif not parent.is_dir():
        problem = f"{parent} is a file, not a folder"
    elif not os.access(parent, os.W_OK):
        problem = f"{parent} is not writable"
    if problem:
        raise AmpgraphError(f"cannot write the {what} to {path}: {problem}; choose another path")


__all__ = ["atomic_write", "check_writable"]
