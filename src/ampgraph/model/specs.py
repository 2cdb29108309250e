"""Model specs as a person gives them: which model, said how, and which tracer to use.

Torch-free, so that the command line can resolve its model options (and consult the cache)
before torch is imported. :func:`ampgraph.model.build.load_model` builds what a spec names.

>>> spec = ModelSpec("cfg/config.json", "config", tracer="hf-fx")
>>> spec, spec.kind, spec.tracer
('cfg/config.json', 'config', 'hf-fx')
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ampgraph.errors import ModelSpecError, clip

#: How a spec was given: ``auto`` is the positional MODEL, recognised by its form.
SPEC_KINDS = ("auto", "bundled", "config", "dir", "module")
#: The tracers of :mod:`ampgraph.capture.tracers` (kept here too: that module imports torch).
TRACERS = ("make-fx", "export", "hf-fx", "fx")
#: The graph torch.export makes, traced faster (see :data:`ampgraph.capture.trace.MAKE_FX`).
DEFAULT_TRACER = "make-fx"


class ModelSpec(str):
    """A model spec string that remembers which option gave it and the tracer to use.

    ``kind`` is ``"auto"`` (the positional MODEL: a bundled name, a config.json path, a model
    folder or ``package.module:factory``, recognised by its form), ``"bundled"``, ``"config"``
    (``--config``), ``"dir"`` (``--model-dir``) or ``"module"`` (``--module``). ``tracer`` is the
    tracer (``--tracer``). It is a ``str``, so code that prints specs or passes them along needs
    to know nothing of it; a plain ``str`` reads as kind ``auto``, tracer ``make-fx``.
    """

    kind: str
    tracer: str

    def __new__(  # noqa: PYI034 - Self needs Python 3.11
        cls, value: str, kind: str = "auto", tracer: str = DEFAULT_TRACER
    ) -> ModelSpec:
        if kind not in SPEC_KINDS:
            raise ValueError(f"unknown spec kind {kind!r}: use one of {', '.join(SPEC_KINDS)}")
        if tracer not in TRACERS:
            raise ValueError(f"unknown tracer {tracer!r}: use one of {', '.join(TRACERS)}")
        obj = super().__new__(cls, value)
        obj.kind = kind
        obj.tracer = tracer
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return (ModelSpec, (str(self), self.kind, self.tracer))


def spec_kind(spec: str) -> str:
    """The kind of a spec: its own for a :class:`ModelSpec`, ``auto`` for a plain string.

    >>> spec_kind("opt-125m"), spec_kind(ModelSpec("m:f", "module"))
    ('auto', 'module')
    """
    return getattr(spec, "kind", "auto")


def spec_tracer(spec: str) -> str:
    """The tracer a spec asks for: its own for a :class:`ModelSpec`, the default otherwise.

    >>> spec_tracer("opt-125m")
    'make-fx'
    """
    return getattr(spec, "tracer", DEFAULT_TRACER)


#: Short family names for bundled configs: what the issue and people call them.
ALIASES: dict[str, str] = {
    "opt": "opt-125m",
    "llama-3": "llama-3-8b",
    "mistral": "mistral-7b",
    "qwen2": "qwen2-0.5b",
    "phi": "phi-2",
    "gpt-neox": "pythia-160m",
    "bert": "bert-base-uncased",
    "t5": "t5-small",
    "resnet": "resnet18",
}


def bundled_key(spec: str) -> str:
    """The catalogue name a bundled spec means: ``"OPT"`` -> ``"opt-125m"``."""
    return ALIASES.get(spec.lower(), spec.lower())


@dataclass(frozen=True)
class ConfigSource:
    """A Hugging Face config a spec names: the model's name, how it was given, and its bytes."""

    name: str
    kind: str  # bundled | config | dir
    path: str
    data: bytes

    def parse(self) -> dict[str, Any]:
        """The config as a dict; a one-line :class:`ModelSpecError` if it is not one."""
        try:
            config = json.loads(self.data)
        except UnicodeDecodeError:
            raise ModelSpecError(
                f"{self.path} is not UTF-8 text: save the config as UTF-8"
            ) from None
        except json.JSONDecodeError as exc:
            raise ModelSpecError(
                f"{self.path} is not valid JSON ({exc.msg}, line {exc.lineno})"
            ) from None
        except RecursionError:
            raise ModelSpecError(f"{self.path} nests too deeply to be a config") from None
        _refuse_ampgraph_file(self.path, config)
        if not isinstance(config, dict):
            raise ModelSpecError(
                f"{self.path} is not a Hugging Face config (a JSON object is expected)"
            )
        return config


#: Where each file ampgraph writes is read back, for a newcomer who gives one as the model.
_READ_BY = {
    "ampgraph.report": "give it with --report {path} (ampgraph render, ampgraph audit), or as A "
    "or B of ampgraph diff",
    "ampgraph.baseline": "check a model against it with ampgraph baseline check {path}, or give "
    "it as A or B of ampgraph diff",
}


def _refuse_ampgraph_file(path: str, data: Any) -> None:
    """A one-line :class:`ModelSpecError` where ``data`` is a file ampgraph wrote (a report, a
    list of them, a baseline), given where a model config goes (``ampgraph audit r.json`` read
    it as a config and said it had no ``model_type``).

    >>> _refuse_ampgraph_file("r.json", [{"schema": "ampgraph.report"}])
    Traceback (most recent call last):
    ...
    ampgraph.errors.ModelSpecError: r.json is a saved ampgraph.report, not a model config: give it with --report r.json (ampgraph render, ampgraph audit), or as A or B of ampgraph diff
    """
    first = data[0] if isinstance(data, list) and data else data
    schema = first.get("schema") if isinstance(first, dict) else None
    if isinstance(schema, str) and schema.startswith("ampgraph."):
        how = _READ_BY.get(schema, "ampgraph reads it where it takes a saved {schema}")
        raise ModelSpecError(
            f"{path} is a saved {schema}, not a model config: {how.format(path=path, schema=schema)}"
        )


def _read(path: Path) -> bytes:
    from ampgraph.report.reading import CONFIG_LIMIT, read_bytes

    # The one reader: a FIFO, /dev/zero or a huge file is one line, never a hang.
    return read_bytes(path, "config", limit=CONFIG_LIMIT)


def _look(path: Path) -> os.stat_result | None:
    """``path``'s status, None where there is nothing; a path that cannot be looked at
    (permissions) is one line saying so, where ``Path.exists`` raised ``PermissionError``."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL in it
        return None
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:  # a name no file system holds: not a path
            return None
        raise ModelSpecError(
            f"cannot look at {clip(str(path))}: {exc.strerror or type(exc).__name__}; check the "
            "path and its permissions"
        ) from None


def _is_dir(status: os.stat_result | None) -> bool:
    return status is not None and stat.S_ISDIR(status.st_mode)


#: Linux's longest path: a spec past it is refused before any file system call.
PATH_MAX = 4096


def _exists(entry: Any) -> bool:
    """Whether a bundled config is there; False for a name no file system holds (a 100 kB
    model name raised ENAMETOOLONG out of ``is_file``)."""
    try:
        return bool(entry.is_file())
    except OSError:
        return False


def resolve_config(spec: str) -> ConfigSource | None:
    """The config a spec names, read without importing torch; None for specs built by code.

    The one place that decides what a config spec means: the model loader builds from it, and
    the cache keys reports by it, so a name is served from the cache exactly when it would load.
    Raises :class:`ModelSpecError` (one line) for a config spec that cannot be read.

    >>> source = resolve_config("opt")
    >>> source.name, source.kind
    ('opt-125m', 'bundled')
    >>> resolve_config("torch.nn:Linear") is None
    True
    """
    if len(spec) > PATH_MAX:  # no file system holds such a path: one line, not ENAMETOOLONG
        raise ModelSpecError(
            f"the model {clip(spec)} ({len(spec):,} characters) is too long to be a model name, "
            "a path or a factory"
        )
    kind = spec_kind(spec)
    if kind == "module":
        return None
    if kind in ("auto", "bundled"):
        key = bundled_key(spec)
        entry = resources.files("ampgraph.model.configs") / f"{key}.json"
        if _exists(entry):
            return ConfigSource(key, "bundled", f"bundled config {key}", entry.read_bytes())
        if kind == "bundled":
            return None
        path = Path(spec)
        if _is_dir(_look(path)):
            kind = "dir"
        elif path.suffix == ".json" or path.name == "config.json":
            kind = "config"
        else:
            return None  # package.module:factory, a bundled factory, or an unknown name
    path = Path(spec)
    if kind == "config":
        if _is_dir(_look(path)):
            raise ModelSpecError(
                f"{clip(spec)} is a folder: use --model-dir {spec} (or its config.json)"
            )
        if not os.path.lexists(path):
            raise ModelSpecError(f"config file {clip(spec)} does not exist")
        name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
        return ConfigSource(name, "config", str(path), _read(path))
    if not _is_dir(_look(path)):
        raise ModelSpecError(f"model folder {clip(spec)} does not exist")
    config = path / "config.json"
    if _look(config) is None and not os.path.lexists(config):
        raise ModelSpecError(
            f"{clip(spec)} has no config.json: point --model-dir at a Hugging Face model folder"
        )
    return ConfigSource(path.resolve().name, "dir", str(config), _read(config))


__all__ = [
    "ALIASES",
    "DEFAULT_TRACER",
    "SPEC_KINDS",
    "TRACERS",
    "ConfigSource",
    "ModelSpec",
    "bundled_key",
    "resolve_config",
    "spec_kind",
    "spec_tracer",
]
