"""Reading files the way every ampgraph input is read: regular files only, bounded, never blocking.

Every file ampgraph reads that a user (or anyone who can write a shared folder) hands it goes
through :func:`read_bytes` or :func:`read_text`: model configs, saved reports, baselines,
DeepSpeed configs, cache entries and the Sphinx directive's inputs. One rule holds for all:

* a symbolic link is followed to the file it names, as :func:`~ampgraph.report.writing.atomic_write`
  follows it (``follow=False``, for the cache, refuses links instead);
* only a regular file is read: a FIFO (a shell's ``<(...)``, an endless pipe) would block until a
  writer came or feed data forever, ``/dev/zero`` never ends, a folder has no bytes. The file is
  opened with ``O_NONBLOCK`` (opening a FIFO then does not wait for a writer) and what was opened
  is checked with ``fstat``, so a file swapped after a first look is still caught;
* the size is bounded before reading (``limit``), and the read never allocates the bound: it
  takes the file's own size, and at most ``limit + 1`` bytes should the file grow meanwhile;
* each refusal is one :class:`~ampgraph.errors.FileReadError` line naming the file, what it is,
  and what to do.

Torch-free, as :mod:`ampgraph.report.writing` is.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "a.json"
>>> _ = path.write_text('{"a": 1}')
>>> read_text(path, "report")
'{"a": 1}'
>>> read_text(pathlib.Path("/dev/zero"), "report")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ampgraph.errors.FileReadError: cannot read the report /dev/zero: it is a character device, ...
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ampgraph.errors import FileReadError

#: The most bytes a configuration file (a model's config.json, a DeepSpeed config) may hold.
CONFIG_LIMIT = 16 * 10**6
#: The most bytes a saved report, list of reports, baseline or cache entry may hold: the
#: cache's default bound, and far above the largest report (a train report of a 70B-shaped
#: model is tens of megabytes).
REPORT_LIMIT = 512 * 10**6
#: Read in pieces of this size past the file's stated size (a file that grows while read).
_CHUNK = 1 << 20


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, in words.

    >>> kind_of(stat.S_IFIFO), kind_of(stat.S_IFDIR)
    ('a FIFO (a named pipe)', 'a folder')
    """
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (a named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def size_text(size: int) -> str:
    """A byte count as messages print it (decimal units, as ``cache info`` does).

    >>> size_text(512 * 10**6), size_text(2500), size_text(7)
    ('512 MB', '2.5 kB', '7 bytes')
    """
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} bytes"


def _refuse(path: Path, what: str, problem: str, todo: str) -> FileReadError:
    shown = str(path) if len(str(path)) <= 200 else f"{str(path)[:200]}\u2026"
    return FileReadError(f"cannot read the {what} {shown}: {problem}; {todo}")


def _open(path: Path, what: str, follow: bool, dir_fd: int | None) -> int:
    """An fd open for reading on ``path``, without waiting on a FIFO, or a one-line error."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        # A look before opening: opening some devices has effects (a tape rewinds); a regular
        # file has none, and fstat below checks what was really opened.
        status = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow)
        if not stat.S_ISREG(status.st_mode):
            raise _refuse(path, what, f"it is {kind_of(status.st_mode)}, not a regular file",
                          "give the path of a regular file")  # fmt: skip
        return os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        if follow and dir_fd is None and os.path.islink(path):  # a dangling link
            target = os.readlink(path)
            raise _refuse(path, what, f"it is a symbolic link to {target[:200]}, which does not "
                          "exist", "check the link") from None  # fmt: skip
        raise _refuse(path, what, "there is no such file", "check the path") from None
    except OSError as exc:
        raise _refuse(path, what, exc.strerror or type(exc).__name__,
                      "check the path and its permissions") from None  # fmt: skip


def open_regular(path: Path | str, what: str) -> int:
    """An fd open for reading on the regular file at ``path`` (a link followed), opened without
    waiting on a FIFO and checked with ``fstat``; else a one-line :class:`FileReadError`. For a
    reader that takes its own pieces (a safetensors shard's header, then one tensor at a time);
    the caller closes the fd.

    >>> open_regular("/dev/null", "shard")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ampgraph.errors.FileReadError: cannot read the shard /dev/null: it is a character device, ...
    """
    path = Path(path)
    fd = _open(path, what, True, None)
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):  # swapped after the first look
        os.close(fd)
        raise _refuse(path, what, f"it is {kind_of(status.st_mode)}, not a regular file",
                      "give the path of a regular file")  # fmt: skip
    return fd


def read_fd(fd: int, path: Path, what: str, limit: int) -> bytes:
    """The bytes of the open file ``fd`` (named ``path`` in errors): a regular file of at most
    ``limit`` bytes, else a one-line :class:`FileReadError`. Does not close ``fd``."""
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        raise _refuse(path, what, f"it is {kind_of(status.st_mode)}, not a regular file",
                      "give the path of a regular file")  # fmt: skip
    too_big = _refuse(path, what, f"it is larger than the {size_text(limit)} an ampgraph "
                      f"{what} may be", "check that it is the file you meant")  # fmt: skip
    if status.st_size > limit:
        raise too_big
    pieces = []
    # The stated size first, in one read; then small pieces, should the file have grown.
    want, total = status.st_size + 1, 0
    while total <= limit:
        piece = os.read(fd, min(want, limit + 1 - total))
        if not piece:
            return b"".join(pieces)
        pieces.append(piece)
        total += len(piece)
        want = _CHUNK
    raise too_big


def read_bytes(
    path: Path | str,
    what: str,
    *,
    limit: int = REPORT_LIMIT,
    follow: bool = True,
    dir_fd: int | None = None,
) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them.

    ``what`` names the file in errors (``"report"``, ``"DeepSpeed config"``). ``follow=False``
    refuses a symbolic link at ``path``; ``dir_fd`` reads ``path`` relative to an open folder.
    Raises :class:`~ampgraph.errors.FileReadError` (an ``AmpgraphError``) with one line.

    >>> read_bytes("/nonexistent.json", "baseline")
    Traceback (most recent call last):
    ...
    ampgraph.errors.FileReadError: cannot read the baseline /nonexistent.json: there is no such file; check the path
    """
    path = Path(path)
    fd = _open(path, what, follow, dir_fd)
    try:
        return read_fd(fd, path, what, limit)
    except OSError as exc:
        raise _refuse(path, what, exc.strerror or type(exc).__name__,
                      "check the file") from None  # fmt: skip
    finally:
        os.close(fd)


def read_text(path: Path | str, what: str, *, limit: int = REPORT_LIMIT) -> str:
    """:func:`read_bytes` decoded as UTF-8 (one line naming the file where it is not).

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "latin.json"
    >>> _ = path.write_bytes(b"\\xff")
    >>> read_text(path, "report")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ampgraph.errors.FileReadError: cannot read the report ...: it is not UTF-8 text; save it as UTF-8
    """
    data = read_bytes(path, what, limit=limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(Path(path), what, "it is not UTF-8 text", "save it as UTF-8") from None


__all__ = [
    "CONFIG_LIMIT", "REPORT_LIMIT", "kind_of", "open_regular", "read_bytes", "read_fd", "read_text",
]  # fmt: skip
