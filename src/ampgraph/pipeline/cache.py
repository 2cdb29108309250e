"""A disk cache of finished analyses, consulted before torch is imported.

Most of a cold run is importing torch and transformers and tracing the model. A report depends only
on the model's config, the example input length, the setting, whether it was checked, and the
environment: the versions of ampgraph, torch and transformers, where they are installed (reports
carry source locations inside them), the Python and the platform. All of those are known without
importing torch (from the installed packages' metadata), so a warm run reads JSON and never
imports torch at all.

The cache lives in ``$AMPGRAPH_CACHE_DIR``, else ``$XDG_CACHE_HOME/ampgraph``, else
``~/.cache/ampgraph``; the entries are in its ``reports`` folder, tagged with a ``CACHEDIR.TAG``.
``ampgraph cache clear`` removes those entries and nothing else; ``--no-cache`` bypasses the cache.

An entry is trusted no more than any file on disk: a cache folder may be shared, restored by CI
from another branch's run, or written by someone else. Each is ``{"format", "key", "request",
"report"}``, where the request is everything its key is the hash of (:func:`request_of`), and
:func:`load` serves it only for that very request, and only with a report that says it is that
model's, in that setting and pass, made by these versions of ampgraph, torch and transformers,
with no ``NaN`` or ``Infinity`` in it. Anything else is a miss, which the fresh analysis replaces.

The entries take at most ``$AMPGRAPH_CACHE_MAX_BYTES`` (default 512 MB, ``0`` caches nothing):
after each store the least recently used go until the rest fit, and an entry served counts as
used (its modification time is set to now).

Why this is hand-written rather than a library such as ``diskcache``: diskcache's default ``Disk``
pickles values, and unpickling runs whatever code the file names, so an entry planted in the
cache folder would decide what code runs; a JSON ``Disk`` of our own would still bring sqlite (a
database and its locks, opened before torch on every warm run) and a dependency, for what is here
a hundred lines of one JSON file per entry, ``os.replace`` and ``os.utime``. Plain files also keep
``clear`` able to remove exactly ampgraph's files and nothing else.

>>> request = request_of({"name": "abc"}, {"setting": "fp32"})
>>> len(key_of(request)), key_of(request) == cache_key({"name": "abc"}, {"setting": "fp32"})
(64, True)
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import platform
import re
import stat
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from ampgraph import __version__
from ampgraph.report.files import atomic_write

#: Bump when the analysis or the entries change in a way the environment does not capture.
#: 3: entries carry their key and request, and the environment where the packages are.
CACHE_FORMAT = 3

#: The variable that bounds the entries' total size, and the bound without it.
MAX_BYTES_VARIABLE = "AMPGRAPH_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 512 * 10**6  # decimal, as `cache info` prints MB
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
        return int(float(match[1]) * _UNITS[match[2].lower()])
    except (OverflowError, ValueError):  # a thousand nines is inf, which int() refuses
        return None


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
        return DEFAULT_MAX_BYTES, (
            f"the default: {MAX_BYTES_VARIABLE}={text!r} is not a size such as 2G"
        )
    return size, MAX_BYTES_VARIABLE


def _installed(dist: str) -> tuple[str, str]:
    """A distribution's version and the folder it is installed in, from its metadata: never by
    importing it (torch takes seconds), and without ``find_spec`` (which imports parents)."""
    try:
        found = metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return "not installed", ""
    return str(found.version), str(Path(str(found.locate_file(""))).resolve())


#: Code that draws, publishes or reads reports but never changes one: left out of the digest, so
#: that editing a diagram's style, the Sphinx directive or a finding's wording keeps every cached
#: analysis.
PRESENTATION = frozenset({"render", "docs/directive.py", "review/audit.py", "review/diff.py", "review/baseline.py"})


def source_digest() -> str:
    """A hash of the analysis code itself (every module but :data:`PRESENTATION`).

    The version number alone would serve a stale analysis to anyone running from a source tree
    or an editable install between releases; hashing ~200 kB of source takes about a millisecond.

    >>> len(source_digest())
    16
    """
    package = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*")):
        relative = path.relative_to(package)
        if path.suffix in (".py", ".json") and not PRESENTATION & {
            relative.as_posix(), *relative.parts
        }:
            digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def environment() -> dict[str, str]:
    """What decides an analysis besides the request, read without importing torch.

    The versions, and where the packages are: reports carry source locations inside torch's and
    transformers' installed files, so a report made in one virtual environment must not be
    served in another, even with the same versions (its locations would point into the first).

    >>> env = environment()
    >>> env["prefix"] == sys.prefix, env["ampgraph"] == __version__
    (True, True)
    """
    torch, torch_at = _installed("torch")
    transformers, transformers_at = _installed("transformers")
    return {
        "ampgraph": __version__,
        "ampgraph_at": str(Path(__file__).resolve().parent.parent),
        "source": source_digest(),
        "torch": torch,
        "torch_at": torch_at,
        "transformers": transformers,
        "transformers_at": transformers_at,
        "prefix": sys.prefix,
        "python": sys.version,
        "platform": f"{sys.platform} {platform.machine()}",
        "format": str(CACHE_FORMAT),
    }


def request_of(
    model_identity: dict[str, Any], request: dict[str, Any], env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Everything a report depends on: what its entry is keyed by, stores, and is checked
    against when served. ``env`` is :func:`environment`, where the caller has it already
    (reading it costs 10 ms).

    It is made plain JSON here (a tuple becomes a list), so it compares equal to the copy an
    entry holds.

    >>> request_of({"name": "m"}, {"shape": (1, 2)}, {})["request"]
    {'shape': [1, 2]}
    """
    payload = {
        "model": model_identity,
        "request": request,
        "env": environment() if env is None else env,
    }
    return json.loads(json.dumps(payload, sort_keys=True))


def key_of(request: dict[str, Any]) -> str:
    """The file name of ``request``'s entry: a hash of it (:func:`request_of`).

    >>> key = key_of({"model": {"name": "m"}, "request": {"b": 1, "a": 2}})
    >>> len(key), key == key_of({"request": {"a": 2, "b": 1}, "model": {"name": "m"}})
    (64, True)
    """
    text = json.dumps(request, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def cache_key(
    model_identity: dict[str, Any], request: dict[str, Any], env: dict[str, str] | None = None
) -> str:
    """:func:`key_of` of :func:`request_of`: a stable hash of what a report depends on.

    >>> len(cache_key({"name": "m"}, {"setting": "fp32"}))
    64
    """
    return key_of(request_of(model_identity, request, env))


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


def _read(path: Path, limit: int) -> Any:
    """The JSON in the file at ``path``, or None: also for a file that is not a regular one (a
    symbolic link, which may point anywhere; a FIFO, which would block), one bigger than
    ``limit`` (no entry that big was stored), or one that is not JSON."""
    # O_NOFOLLOW: a link is not an entry; O_NONBLOCK: opening a FIFO must not wait for a writer.
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        with os.fdopen(os.open(path, flags), "rb") as handle:
            status = os.fstat(handle.fileno())
            if not stat.S_ISREG(status.st_mode) or status.st_size > limit:
                return None
            data = handle.read(limit + 1)
        return json.loads(data, parse_constant=_not_json)
    except (OSError, ValueError, RecursionError):
        return None


def _release(version: object) -> object:
    """A version without its local part: torch's ``__version__`` says ``2.5.1+cu124`` where its
    metadata says ``2.5.1``."""
    return version.split("+")[0] if isinstance(version, str) else version


def describes(report: dict[str, Any], request: dict[str, Any]) -> bool:
    """Whether ``report`` says it is the analysis ``request`` asks for: the model by its name,
    the setting, the pass, and the versions of ampgraph, torch and transformers it was made by.

    The stored request already says all of this; the report is checked too, so that an entry
    whose wrapper was rewritten around another model's report is not served.

    >>> request = request_of({"name": "m"}, {"setting": {"name": "fp32"}}, {"ampgraph": "1"})
    >>> report = {"model": "m", "setting": {"name": "fp32"}, "versions": {"ampgraph": "1"}}
    >>> describes(report, request), describes({**report, "model": "other"}, request)
    (True, False)
    """
    model = request.get("model") or {}
    asked = request.get("request") or {}
    env = request.get("env") or {}
    versions = report.get("versions")
    return (
        isinstance(versions, dict)
        and ("name" not in model or report.get("model") == model["name"])
        and ("setting" not in asked or report.get("setting") == asked["setting"])
        and report.get("pass", "forward") == asked.get("pass_", "forward")
        and all(
            _release(versions.get(name)) == _release(env[name])
            for name in ("ampgraph", "torch", "transformers")
            if name in env
        )
    )


def load(request: dict[str, Any]) -> dict[str, Any] | None:
    """The cached report dict for ``request`` (:func:`request_of`), or None.

    None also for every entry not stored for exactly this request (another model's, copied or
    relabelled; one of an older format), whose report does not :func:`describe <describes>` it,
    or that is unreadable, damaged or holds ``NaN``: the next store replaces it. An entry served
    is marked as used now, the last to be evicted.

    >>> load(request_of({"name": "never stored"}, {}, {})) is None
    True
    """
    request = json.loads(json.dumps(request))
    key = key_of(request)
    path = _path(key)
    entry = _read(path, bound()[0])
    if not (
        isinstance(entry, dict)
        and entry.get("format") == CACHE_FORMAT
        and entry.get("key") == key
        and entry.get("request") == request
    ):
        return None
    report = entry.get("report")
    if not isinstance(report, dict) or not describes(report, request):
        return None
    # Used now: eviction goes by modification time. A read-only cache still serves.
    with contextlib.suppress(OSError):
        os.utime(path, follow_symlinks=os.utime not in os.supports_follow_symlinks)
    return report


def store(request: dict[str, Any], report: dict[str, Any]) -> None:
    """Cache ``report`` as the answer to ``request`` (:func:`request_of`), then evict the least
    recently used entries until all fit :func:`bound`.

    Never an error: a cache that cannot be written, a report that is not plain JSON, one bigger
    than the whole bound, or a :func:`clear` that removes the folder meanwhile, skip the store.

    >>> import tempfile
    >>> from unittest import mock
    >>> request = request_of({"name": "m"}, {}, {})
    >>> with mock.patch.dict(os.environ, {"AMPGRAPH_CACHE_DIR": tempfile.mkdtemp()}):
    ...     store(request, {"model": "m", "versions": {}})
    ...     load(request)
    {'model': 'm', 'versions': {}}
    """
    request = json.loads(json.dumps(request))
    key = key_of(request)
    entry = {"format": CACHE_FORMAT, "key": key, "request": request, "report": report}
    try:
        data = json.dumps(entry, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError):
        return  # load() would refuse it: NaN, or something JSON cannot hold
    limit = bound()[0]
    if len(data) > limit:
        return  # evicting every other entry would still not make room
    folder = cache_dir() / ENTRIES
    path = folder / f"{key}.json"
    try:
        if path.is_symlink():
            return  # never written through: the link may point anywhere
        atomic_write(path, data)
        # The tag after the entry: should a clear() have removed the folder between the two,
        # the entry it recreated gets its tag, so the next clear finds it (clear() restores the
        # tag likewise when an entry lands while it removes the folder).
        tag = folder / TAG_NAME
        if not tag.is_file():
            atomic_write(tag, TAG)
        _evict(limit, keep=path)
    except OSError:
        pass


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
    """Whether ``folder`` is a real folder that carries ampgraph's tag."""
    tag = folder / TAG_NAME
    if folder.is_symlink() or not folder.is_dir() or tag.is_symlink():
        return False
    try:
        return tag.read_bytes() == TAG
    except OSError:
        return False


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
    ...     store(request_of({"name": "m"}, {}, {}), {"model": "m", "versions": {}})
    ...     clear()[0], clear()
    (1, (0, 0))
    """
    from ampgraph.errors import AmpgraphError

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
    for path in _entries():
        with contextlib.suppress(FileNotFoundError):
            sizes.append(path.stat().st_size)
    return cache_dir(), len(sizes), sum(sizes)


def model_identity(spec: str) -> dict[str, Any] | None:
    """What a model spec's analysis depends on, without importing torch, or None if unknown.

    A config spec is identified by the model's name as the user named it (reports and file names
    carry it) and the config's bytes, resolved exactly as the loader resolves it
    (:func:`ampgraph.model.specs.resolve_config`), so an alias is served from the cache and a spec the
    loader would refuse is never served. A ``package.module:factory`` spec runs arbitrary code,
    so it is never cached.

    >>> model_identity("opt")["name"]
    'opt-125m'
    """
    from ampgraph.errors import ModelSpecError
    from ampgraph.model.specs import resolve_config

    try:
        source = resolve_config(spec)
    except ModelSpecError:
        return None  # the analysis will say what is wrong with it
    if source is None:
        return None
    return {
        "name": source.name,
        "kind": source.kind,
        "config_sha256": hashlib.sha256(source.data).hexdigest(),
    }
