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
import hashlib
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampgraph.errors import AmpgraphError
from ampgraph.pipeline.cache_folder import (  # the folder's API, as it was here before
    DEFAULT_MAX_BYTES,
    ENTRIES,
    MAX_BYTES_VARIABLE,
    TAG,
    TAG_NAME,
    _evict,
    _folder_fd,
    _limit,
    _path,
    _read,
    bound,
    cache_dir,
    clear,
    disk_note,
    info,
    parse_size,
    store_entry,
)
from ampgraph.version import __version__

if TYPE_CHECKING:
    from ampgraph.pipeline.request import AnalysisRequest

#: Bump when the analysis or the entries change in a way the environment does not capture.
#: 3: entries carry their key and request, and the environment where the packages are.
CACHE_FORMAT = 3

def _installed(dist: str) -> tuple[str, str]:
    """A distribution's version and the folder it is installed in, from its metadata: never by
    importing it (torch takes seconds), and without ``find_spec`` (which imports parents)."""
    try:
        found = metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return "not installed", ""
    return str(found.version), str(Path(str(found.locate_file(""))).resolve())


#: Code that draws, publishes, reads or asks for reports but never changes one: left out of the
#: digest, so that editing a diagram's style, a format's writer, the command line, the Sphinx
#: directive or a finding's wording keeps every cached analysis. The command line and the
#: directive only build the request (:class:`~ampgraph.pipeline.request.AnalysisRequest`), which
#: is in the key by its fields; what a setting or a recipe means is decided in ``settings.py`` and
#: ``recipes.py``, which are hashed. Everything else is hashed: the analysis code and its data
#: (capture, annotate, the policy tables, the pipeline, the records a report is made of...), so a
#: module added anywhere else counts too.
PRESENTATION = frozenset({
    "cli", "formats", "render", "docs", "explorer", "notebook.py", "sphinx.py", "__main__.py",
    "review/audit.py", "review/diff.py", "review/baseline.py",
})  # fmt: skip


def source_digest(package: Path | None = None) -> str:
    """A hash of the analysis code itself: every module and data file of ``package`` (None:
    the installed ampgraph's) but :data:`PRESENTATION`.

    The version number alone would serve a stale analysis to anyone running from a source tree
    or an editable install between releases; hashing ~200 kB of source takes about a millisecond.

    >>> len(source_digest())
    16
    """
    package = package or Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*")):
        relative = path.relative_to(package)
        if path.suffix in (".py", ".json") and not PRESENTATION & {
            relative.as_posix(), *relative.parts
        }:
            digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


#: The CPU features that decide which kernels a CPU report predicts (oneDNN takes 16-bit
#: convolutions only where torch's ``mkldnn_bf16_device_check`` / ``mkldnn_fp16_device_check``
#: find them: ``ampgraph.annotate.cpu_backend``), and the variables that cap oneDNN's ISA.
CPU_FEATURES = frozenset(
    {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_fp16",
     "amx_tile", "amx_bf16", "amx_fp16"}
)  # fmt: skip


def cpu_kind(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU features a CPU prediction depends on, read without torch: an AMD EPYC and a
    Sapphire Rapids Xeon give different reports (oneDNN's 16-bit convolutions), so a cache shared
    between them must not serve one's report on the other.

    >>> isinstance(cpu_kind(), str), cpu_kind("/nonexistent").startswith("unknown")
    (True, True)
    """
    caps = [f"{k}={os.environ[k]}" for k in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
            if k in os.environ]  # fmt: skip
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            lines = (line for line in f if line.startswith("flags"))
            flags = next((line.split(":", 1)[1].split() for line in lines), [])
    except OSError:
        return " ".join(["unknown", platform.processor(), *caps])
    return " ".join([*sorted(CPU_FEATURES.intersection(flags)), *caps]) or "none"


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
        "cpu": cpu_kind(),
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
    limit = _limit()
    folder = _folder_fd()
    if folder is None:
        return None
    try:
        entry = _read(path.name, folder, limit)
    finally:
        os.close(folder)
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
    # Used now: eviction goes by modification time. A read-only cache still serves. A bound
    # lowered since the entries were stored holds from the next run on, not from a store.
    with contextlib.suppress(OSError, AmpgraphError):
        os.utime(path, follow_symlinks=os.utime not in os.supports_follow_symlinks)
        _evict(limit, keep=path)
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
    limit = _limit()
    path = cache_dir() / ENTRIES / f"{key}.json"
    with contextlib.suppress(OSError, AmpgraphError):
        if len(data) <= limit:  # else evicting every other entry would still not make room
            store_entry(path.name, data)
        _evict(limit, keep=path)  # also where the bound was lowered below what is stored


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


def entry_requests(request: AnalysisRequest) -> list[dict[str, Any] | None]:
    """What the report of ``request``'s model in each of its settings is cached under and
    checked against (:func:`request_of` of :meth:`AnalysisRequest.key_fields
    <ampgraph.pipeline.request.AnalysisRequest.key_fields>`); None where it is never cached (a
    ``package.module:factory`` spec runs arbitrary code, and a model handed over as an object
    has no identity).

    >>> from ampgraph.pipeline.request import AnalysisRequest
    >>> [r["request"]["setting"]["name"] for r in entry_requests(AnalysisRequest("opt", ("fp32",)))]
    ['fp32']
    """
    identity = model_identity(request.model) if request.model is not None else None
    if identity is None:
        return [None for _ in request.settings]
    env = environment()
    return [request_of(identity, request.key_fields(s), env) for s in request.settings]


__all__ = [
    "CACHE_FORMAT", "DEFAULT_MAX_BYTES", "ENTRIES", "MAX_BYTES_VARIABLE", "TAG", "TAG_NAME",
    "bound", "cache_dir", "cache_key", "clear", "describes", "disk_note", "entry_requests",
    "environment", "info",
    "key_of", "load", "model_identity", "parse_size", "request_of", "source_digest", "store",
]  # fmt: skip
