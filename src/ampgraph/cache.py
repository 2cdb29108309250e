"""A disk cache of finished analyses, consulted before torch is imported.

Most of a cold run is importing torch and transformers and tracing the model. A report depends only
on the model's config, the example input length, the setting, whether it was checked, and the
versions of ampgraph, torch and transformers; all of those are known without importing torch
(versions come from the installed packages' metadata). So a warm run reads JSON and never imports
torch at all.

The cache lives in ``$AMPGRAPH_CACHE_DIR``, else ``$XDG_CACHE_HOME/ampgraph``, else
``~/.cache/ampgraph``; the entries are in its ``reports`` folder, tagged with a ``CACHEDIR.TAG``.
``ampgraph cache clear`` removes those entries and nothing else; ``--no-cache`` bypasses the cache.

>>> key = cache_key({"model": "abc"}, {"name": "fp32"})
>>> len(key)
64
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from importlib import metadata
from pathlib import Path
from typing import Any

from ampgraph import __version__
from ampgraph.files import atomic_write

#: Bump when the analysis changes in a way the versions above do not capture.
CACHE_FORMAT = 2


def cache_dir() -> Path:
    """Where cached reports live (created on first write)."""
    explicit = os.environ.get("AMPGRAPH_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ampgraph"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


#: Code that draws, publishes or reads reports but never changes one: left out of the digest, so
#: that editing a diagram's style, the Sphinx directive or a finding's wording keeps every cached
#: analysis.
PRESENTATION = frozenset({"render", "sphinx.py", "audit.py", "diff.py", "baseline.py"})


def source_digest() -> str:
    """A hash of the analysis code itself (every module but :data:`PRESENTATION`).

    The version number alone would serve a stale analysis to anyone running from a source tree
    or an editable install between releases; hashing ~200 kB of source takes about a millisecond.
    """
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*")):
        if path.suffix in (".py", ".json") and not PRESENTATION & set(
            path.relative_to(package).parts
        ):
            digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def environment() -> dict[str, str]:
    """The versions that decide an analysis, read without importing the packages."""
    return {
        "ampgraph": __version__,
        "source": source_digest(),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "format": str(CACHE_FORMAT),
    }


def cache_key(
    model_identity: dict[str, Any], request: dict[str, Any], env: dict[str, str] | None = None
) -> str:
    """A stable hash of what a report depends on; ``env`` is :func:`environment`, where the
    caller has it already (reading it costs 10 ms)."""
    payload = {"model": model_identity, "request": request, "env": env or environment()}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


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


def load(key: str) -> dict[str, Any] | None:
    """The cached report dict for ``key``, or None: also for an unreadable, damaged or foreign
    entry (``[]``, ``42``, truncated JSON), which the next store replaces."""
    try:
        data = json.loads(_path(key).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def store(key: str, report: dict[str, Any]) -> None:
    """Cache a report dict; a cache that cannot be written is skipped, not an error."""
    try:
        tag = cache_dir() / ENTRIES / TAG_NAME
        if not tag.is_file():
            atomic_write(tag, TAG)
        atomic_write(_path(key), json.dumps(report, separators=(",", ":")).encode())
    except OSError:
        pass


def _is_ours(folder: Path) -> bool:
    """Whether ``folder`` is a real folder that carries ampgraph's tag."""
    tag = folder / TAG_NAME
    if folder.is_symlink() or not folder.is_dir() or tag.is_symlink():
        return False
    try:
        return tag.read_bytes() == TAG
    except OSError:
        return False


def _entries() -> list[Path]:
    """The files ampgraph wrote: ``reports/<sha256>.json`` (and its temporary files), in a
    ``reports`` folder that carries ampgraph's tag.

    Symlinks are never followed or removed, and nothing outside ``reports/`` is looked at.
    """
    folder = cache_dir() / ENTRIES
    if not _is_ours(folder):
        return []
    return sorted(
        path
        for path in folder.iterdir()
        if _ENTRY.fullmatch(path.name) and path.is_file() and not path.is_symlink()
    )


def clear() -> tuple[int, int]:
    """Remove every cached entry, and only those; returns (files removed, bytes freed).

    The tag and the folder go too once nothing else is left in it. Raises
    :class:`~ampgraph.errors.AmpgraphError` with one line when the cache cannot be written (a
    read-only folder).
    """
    from ampgraph.errors import AmpgraphError

    removed = freed = 0
    try:
        for path in _entries():
            size = path.stat().st_size
            path.unlink()
            removed += 1
            freed += size
        folder = cache_dir() / ENTRIES
        if _is_ours(folder) and {p.name for p in folder.iterdir()} == {TAG_NAME}:
            (folder / TAG_NAME).unlink()
            folder.rmdir()
    except OSError as exc:
        raise AmpgraphError(
            f"cannot clear the cache in {cache_dir()}: {exc.strerror}; check its permissions "
            "or point AMPGRAPH_CACHE_DIR elsewhere"
        ) from None
    return removed, freed


def info() -> tuple[Path, int, int]:
    """(cache directory, number of entries, total bytes)."""
    files = _entries()
    return cache_dir(), len(files), sum(p.stat().st_size for p in files)


def model_identity(spec: str) -> dict[str, Any] | None:
    """What a model spec's analysis depends on, without importing torch, or None if unknown.

    A config spec is identified by the model's name as the user named it (reports and file names
    carry it) and the config's bytes, resolved exactly as the loader resolves it
    (:func:`ampgraph.specs.resolve_config`), so an alias is served from the cache and a spec the
    loader would refuse is never served. A ``package.module:factory`` spec runs arbitrary code,
    so it is never cached.

    >>> model_identity("opt")["name"]
    'opt-125m'
    """
    from ampgraph.errors import ModelSpecError
    from ampgraph.specs import resolve_config

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
