"""Writing files the way every ampgraph output is written: atomically, and never over a device.

Every file ampgraph writes (diagrams, reports, baselines, verify records, cache entries, the
Sphinx directive's figures) goes through :func:`atomic_write`, so one rule holds for all of them:

* a regular file (or nothing) at the path is replaced atomically: readers see the old file or
  the new one, never half, and a failed write leaves the old one;
* a symbolic link is followed: the file it points to is replaced, the link stays a link;
* a character device or a FIFO (``/dev/null``, ``/dev/stdout``, a shell's ``>(...)``) is written
  through, as a shell's ``>`` would: renaming over it would replace ``/dev/null`` with a regular
  file for the whole machine when ampgraph runs as root;
* anything else (a folder, a block device, a socket) is refused in one line, before any work
  where the command calls :func:`check_writable` first.

Torch-free, so the cache, the renderer and verify's records share it.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
>>> atomic_write(path, b"hello")
>>> path.read_text(), oct(path.stat().st_mode & 0o777) in ("0o644", "0o664", "0o600")
('hello', True)
>>> atomic_write(pathlib.Path("/dev/null"), b"gone")  # written through, still a device
>>> pathlib.Path("/dev/null").is_char_device()
True
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from ampgraph.errors import AmpgraphError
from ampgraph.report.reading import kind_of


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _existing(path: Path) -> os.stat_result | None:
    """``path``'s status, following links; None where nothing is there (or a dangling link)."""
    try:
        return path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _target(path: Path) -> Path:
    """Where a write to ``path`` lands: a symbolic link's final target (made absolute), so that
    renaming replaces the file the link names, not the link."""
    return path.resolve() if path.is_symlink() else path


def atomic_write(path: Path, data: bytes, *, mode: int = 0o666) -> None:
    """Write ``data`` to ``path``: atomically over a regular file, through a device or FIFO.

    For a regular file a temporary file in the same folder is renamed over ``path``. ``mkstemp``
    makes it private (0600); the result gets ``mode`` less the umask, as ``open()`` would have
    given it. A character device or FIFO is opened and written as it is (never created,
    truncated or replaced); a folder, block device or socket raises :class:`IsADirectoryError`
    or :class:`OSError` with what it is. Errors are ``OSError``: callers say whose file it was.
    """
    path = _target(Path(path))
    status = _existing(path)
    if status is not None and not stat.S_ISREG(status.st_mode):
        if stat.S_ISCHR(status.st_mode) or stat.S_ISFIFO(status.st_mode):
            # No O_CREAT: should the device vanish between the stat and here, fail, not create.
            fd = os.open(path, os.O_WRONLY)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            return
        if stat.S_ISDIR(status.st_mode):
            raise IsADirectoryError(21, "it is a folder", str(path))
        raise OSError(f"it is {kind_of(status.st_mode)}, which ampgraph never writes to or replaces")
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
    """Fail in one line, before any work, if :func:`atomic_write` could not write ``path``.

    >>> check_writable(Path("/proc/version/x"), "record")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ampgraph.errors.AmpgraphError: cannot write the record to /proc/version/x: ...
    >>> check_writable(Path("/dev/null"), "record")  # a device is written through: fine
    """
    target = _target(Path(path))
    status = _existing(target)
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    problem = None
    if status is not None and not stat.S_ISREG(status.st_mode):
        if stat.S_ISCHR(status.st_mode) or stat.S_ISFIFO(status.st_mode):
            if not os.access(target, os.W_OK):
                problem = "it is a device that is not writable"
        else:
            problem = f"it is {kind_of(status.st_mode)}"
    elif not parent.is_dir():
        problem = f"{parent} is a file, not a folder"
    elif not os.access(parent, os.W_OK):
        problem = f"{parent} is not writable"
    if problem:
        raise AmpgraphError(f"cannot write the {what} to {path}: {problem}; choose another path")


def check_folder_writable(folder: Path, what: str = "files") -> None:
    """Fail in one line, before any work, if files could not be written into ``folder`` (made
    where it is missing): it, or the nearest folder above it that exists, must be a writable
    folder (through a symbolic link: a link to a device or a FIFO is neither).

    >>> check_folder_writable(Path("/dev/null"), "overlays")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ampgraph.errors.AmpgraphError: cannot write the overlays to /dev/null: it is a ...
    """
    existing = Path(folder)
    while _existing(existing) is None and not existing.is_symlink() and existing != existing.parent:
        existing = existing.parent
    status = _existing(existing)
    problem = None
    if status is None:
        problem = f"{existing} is a dangling symbolic link"
    elif not stat.S_ISDIR(status.st_mode):
        kind = "a file" if stat.S_ISREG(status.st_mode) else kind_of(status.st_mode)
        problem = f"{'it' if existing == Path(folder) else existing} is {kind}, not a folder"
    elif not os.access(existing, os.W_OK | os.X_OK):
        problem = f"{existing} is not writable"
    if problem:
        raise AmpgraphError(f"cannot write the {what} to {folder}: {problem}; choose another "
                            "folder")  # fmt: skip


__all__ = ["atomic_write", "check_folder_writable", "check_writable"]
