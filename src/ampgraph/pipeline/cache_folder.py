"""The cache's folder on disk: where it is, its bound, its tag, and what is read from or written
into it (:mod:`ampgraph.pipeline.cache` decides what an entry holds and when it is served).

Nothing here trusts the folder: it may be shared, restored from another run, or planted. The
entries' folder is opened once (``O_NOFOLLOW``: a ``reports`` that is a symbolic link is not
ours), and each entry is read and written relative to it, only where a regular file (or
nothing) is at its path: a FIFO planted there is skipped, never written through or waited on.
A read takes the entry's own size, never the configured bound, which may be far above memory.

>>> parse_size("2G"), bound()[0] > 0
(2000000000, True)
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import stat
import sys
from pathlib import Path
from typing import Any

from ampgraph.errors import AmpgraphError
from ampgraph.report.writing import atomic_write

#: The variable that bounds the entries' total size, and the bound without it.
MAX_BYTES_VARIABLE = "AMPGRAPH_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 512 * 10**6  # decimal, as `cache info` prints MB
#: Sizes from here on are refused (an off_t holds less): a bound of 1e30 bytes is a typo.
MAX_SIZE = 2**63
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?)\s*([kmgt]?)b?\s*", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def cache_dir() -> Path:
    """Where cached reports live (created on first write).

    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {"AMPGRAPH_CACHE_DIR": "/tmp/c"}):
    ...     cache_dir()
    PosixPath('/tmp/c')
    """
    explicit = os.environ.get("AMPGRAPH_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ampgraph"


def parse_size(text: str) -> int | None:
    """A number of bytes as ``$AMPGRAPH_CACHE_MAX_BYTES`` spells it (``1000000``, ``512M``,
    ``2GB``: decimal units), or None for anything else.

    >>> parse_size("2G"), parse_size("512 MB"), parse_size("1000"), parse_size("lots")
    (2000000000, 512000000, 1000, None)
    """
    match = _SIZE.fullmatch(text)
    if match is None:
        return None
    try:
        size = int(float(match[1]) * _UNITS[match[2].lower()])
    except (OverflowError, ValueError):  # a thousand nines is inf, which int() refuses
        return None
    # Past 2**63 no file offset (off_t) or read size can hold it: nonsense, not a bound.
    return size if size < MAX_SIZE else None


def bound() -> tuple[int, str]:
    """The most bytes the entries may take together, and where that number comes from.

    A value of ``$AMPGRAPH_CACHE_MAX_BYTES`` that is not a size leaves the default, and says so
    (``ampgraph cache info`` prints it): a typo must not stop every command.

    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {MAX_BYTES_VARIABLE: "1G"}):
    ...     bound()
    (1000000000, 'AMPGRAPH_CACHE_MAX_BYTES')
    >>> with mock.patch.dict(os.environ, {MAX_BYTES_VARIABLE: "lots"}):
    ...     bound()[0] == DEFAULT_MAX_BYTES
    True
    """
    text = os.environ.get(MAX_BYTES_VARIABLE, "")
    if not text.strip():
        return DEFAULT_MAX_BYTES, f"the default; {MAX_BYTES_VARIABLE} sets it"
    size = parse_size(text)
    if size is None:
        shown = repr(text) if len(text) <= 40 else repr(text[:40]) + "\u2026"
        return DEFAULT_MAX_BYTES, (
            f"the default: {MAX_BYTES_VARIABLE}={shown} is not a size such as 2G (a number of "
            "bytes below 2**63, with k, M, G or T)"
        )
    return size, MAX_BYTES_VARIABLE


_warned: list[str] = []


def _limit() -> int:
    """:func:`bound` for a load or store, saying once on stderr when the variable is nonsense
    (every command still runs: the cache keeps its default bound)."""
    limit, source = bound()
    if source.startswith("the default:") and source not in _warned:
        _warned.append(source)
        print(f"ampgraph: the cache uses {source}", file=sys.stderr)
    return limit


def disk_note(limit: int) -> str | None:
    """A note where ``limit`` exceeds the disk that holds the cache (None where it fits, or
    the disk cannot be asked): such a bound never evicts, the disk fills first.

    >>> disk_note(1) is None, "larger than" in (disk_note(MAX_SIZE - 1) or "")
    (True, True)
    """
    import shutil

    folder = cache_dir()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        total = shutil.disk_usage(folder).total
    except OSError:
        return None
    if limit <= total:
        return None
    return (
        f"note: the bound, {limit / 1e9:.4g} GB, is larger than the disk that holds the cache "
        f"({total / 1e9:.4g} GB): the disk fills before the least recently used entries go"
    )


#: The folder under the cache directory that holds ampgraph's entries, and what they are named:
#: the only files ``clear`` ever removes (the directory may be shared, or set by mistake).
ENTRIES = "reports"
_ENTRY = re.compile(r"\.?[0-9a-f]{64}\.json(\.[A-Za-z0-9_]+\.tmp)?")
#: The marker ampgraph writes into its entries' folder: a Cache Directory Tagging Specification
#: tag (https://bford.info/cachedir/), so backup tools skip the folder. ``clear`` removes entries
#: only from a folder that carries it: a folder of the user's own, even one named ``reports``
#: holding files named like entries, is never touched.
TAG_NAME = "CACHEDIR.TAG"
TAG = (
    b"Signature: 8a477f597d28d172789f06886806bc55\n"
    b"# This file is a cache directory tag created by ampgraph.\n"
    b"# For information about cache directory tags, see https://bford.info/cachedir/\n"
)


def _path(key: str) -> Path:
    return cache_dir() / ENTRIES / f"{key}.json"


def _not_json(name: str) -> None:
    """``json.loads`` reads ``NaN`` and ``Infinity`` as floats; no report holds one."""
    raise ValueError(f"{name} is not JSON")


_FOLDER_FLAGS = (
    os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)  # fmt: skip


def _folder_fd() -> int | None:
    """An fd on the entries' folder, or None where there is none or it is not a real folder (a
    symbolic link named ``reports`` is not followed: entries never land where it points). Reads
    and writes go through the fd, so the folder cannot be swapped for a link between them."""
    try:
        return os.open(cache_dir() / ENTRIES, _FOLDER_FLAGS)
    except OSError:
        return None


def _read(name: str, folder: int, limit: int) -> Any:
    """The JSON in the entry ``name`` of ``folder``, or None: also for one that is not a regular
    file (a symbolic link, which may point anywhere; a FIFO, which would block), one bigger
    than ``limit`` (no entry that big was stored), or one that is not JSON. The read takes the
    file's own size, never the bound (which may be far above memory)."""
    from ampgraph.report.reading import read_bytes

    try:
        data = read_bytes(name, "cache entry", limit=limit, follow=False, dir_fd=folder)
        return json.loads(data, parse_constant=_not_json)
    except (AmpgraphError, ValueError, RecursionError):
        return None


def _write(folder: int, name: str, data: bytes) -> bool:
    """Write ``name`` in ``folder`` atomically (a temporary file renamed over it), only where
    nothing or a regular file is there: a FIFO, link or folder at an entry's path is not ours,
    never written through or replaced. Returns whether it was written."""
    try:
        if not stat.S_ISREG(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
            return False
    except FileNotFoundError:
        pass
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags | getattr(os, "O_CLOEXEC", 0), 0o666, dir_fd=folder)  # umask applies
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
        raise
    return True


def store_entry(name: str, data: bytes) -> None:
    """Write the entry ``name`` into the entries' folder, made and tagged where there is none;
    nothing where that folder is not ampgraph's (a link, or a folder of the user's own)."""
    folder = cache_dir() / ENTRIES
    folder.mkdir(parents=True, exist_ok=True)
    fd = _folder_fd()
    if fd is None:
        return  # a link named reports, or a file: not ours
    try:
        if not _tagged(fd):
            # Tagged only where it holds nothing but entries: a clear() just emptied it, or it
            # was made now. A folder of someone else's is never written into.
            if not {*os.listdir(fd)} <= {n for n in os.listdir(fd) if _ENTRY.fullmatch(n)}:
                return
            _write(fd, TAG_NAME, TAG)
        # Should a clear() remove the folder now, writing into the removed one fails: no entry
        # lands untagged (clear() restores the tag when an entry lands while it removes it).
        _write(fd, name, data)
    finally:
        os.close(fd)


def _tagged(folder: int) -> bool:
    """Whether the open ``folder`` holds ampgraph's tag: a regular file (a FIFO there must not
    block the read), not a link."""
    from ampgraph.report.reading import read_bytes

    try:
        return read_bytes(TAG_NAME, "cache tag", limit=len(TAG), follow=False, dir_fd=folder) == TAG
    except AmpgraphError:
        return False


def _evict(limit: int, keep: Path) -> None:
    """Remove the least recently used entries (oldest modification time) until the rest take at
    most ``limit`` bytes, never ``keep`` (the entry just stored). Entries another process removes
    meanwhile are skipped."""
    found = []
    for path in _entries():
        try:
            status = path.stat()
        except FileNotFoundError:
            continue
        found.append((status.st_mtime, path.name, status.st_size, path))
    total = sum(size for _, _, size, _ in found)
    for _, _, size, path in sorted(found):
        if total <= limit:
            return
        if path != keep:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            total -= size


def _is_ours(folder: Path) -> bool:
    """Whether ``folder`` is a real folder (not a link) that carries ampgraph's tag."""
    try:
        fd = os.open(folder, _FOLDER_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return False  # a symbolic link named reports
        raise  # unsearchable: info() and clear() say so
    try:
        return _tagged(fd)
    finally:
        os.close(fd)


def _names(folder: Path) -> set[str]:
    """The names in ``folder``; none once another :func:`clear` has removed it."""
    try:
        return {p.name for p in folder.iterdir()}
    except (FileNotFoundError, NotADirectoryError):
        return set()


def _entries() -> list[Path]:
    """The files ampgraph wrote: ``reports/<sha256>.json`` (and its temporary files), in a
    ``reports`` folder that carries ampgraph's tag.

    Symlinks are never followed or removed, and nothing outside ``reports/`` is looked at.
    """
    folder = cache_dir() / ENTRIES
    if not _is_ours(folder):
        return []
    return sorted(
        folder / name
        for name in _names(folder)
        if _ENTRY.fullmatch(name) and (folder / name).is_file() and not (folder / name).is_symlink()
    )


def clear() -> tuple[int, int]:
    """Remove every cached entry, and only those; returns (files removed, bytes freed).

    The tag and the folder go too once nothing else is left in it. Safe beside another clear or
    store: a file another process removed first is not an error, and an entry stored meanwhile
    is either removed or kept with its tag. Raises :class:`~ampgraph.errors.AmpgraphError` with
    one line when the cache cannot be written (a read-only folder).

    >>> import tempfile
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {"AMPGRAPH_CACHE_DIR": tempfile.mkdtemp()}):
    ...     store_entry("0" * 64 + ".json", b"{}")
    ...     clear()[0], clear()
    (1, (0, 0))
    """
    removed = freed = 0
    folder = cache_dir() / ENTRIES
    try:
        for path in _entries():
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                continue  # another clear, or a store's eviction, removed it first
            removed += 1
            freed += size
        if _is_ours(folder) and _names(folder) == {TAG_NAME}:
            with contextlib.suppress(FileNotFoundError):
                (folder / TAG_NAME).unlink()
            try:
                folder.rmdir()
            except FileNotFoundError:
                pass  # another clear removed it
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                atomic_write(folder / TAG_NAME, TAG)  # a store landed meanwhile: keep it ours
    except OSError as exc:
        raise AmpgraphError(
            f"cannot clear the cache in {cache_dir()}: {exc.strerror}; check its permissions "
            "or point AMPGRAPH_CACHE_DIR elsewhere"
        ) from None
    return removed, freed


def info() -> tuple[Path, int, int]:
    """(cache directory, number of entries, total bytes); :func:`bound` is their limit.

    >>> import tempfile
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {"AMPGRAPH_CACHE_DIR": "/nonexistent/ampgraph"}):
    ...     info()
    (PosixPath('/nonexistent/ampgraph'), 0, 0)
    """
    sizes = []
    try:
        for path in _entries():
            with contextlib.suppress(FileNotFoundError):
                sizes.append(path.stat().st_size)
    except OSError as exc:
        raise AmpgraphError(
            f"cannot read the cache in {cache_dir()}: {exc.strerror or exc}; check its "
            "permissions or point AMPGRAPH_CACHE_DIR elsewhere"
        ) from None
    return cache_dir(), len(sizes), sum(sizes)
