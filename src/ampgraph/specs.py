"""Model specs as a person gives them: which model, said how, and which tracer to use.

Torch-free, so that the command line can resolve its model options (and consult the cache)
before torch is imported. :func:`ampgraph.models.load_model` builds what a spec names.

>>> spec = ModelSpec("cfg/config.json", "config", tracer="hf-fx")
>>> spec, spec.kind, spec.tracer
('cfg/config.json', 'config', 'hf-fx')
"""

from __future__ import annotations

from typing import Any

#: How a spec was given: ``auto`` is the positional MODEL, recognised by its form.
SPEC_KINDS = ("auto", "bundled", "config", "dir", "module")
#: The frontends of :mod:`ampgraph.frontends` (kept here too: that module imports torch).
TRACERS = ("export", "hf-fx", "fx")


class ModelSpec(str):
    """A model spec string that remembers which option gave it and the tracer to use.

    ``kind`` is ``"auto"`` (the positional MODEL: a bundled name, a config.json path, a model
    folder or ``package.module:factory``, recognised by its form), ``"bundled"``, ``"config"``
    (``--config``), ``"dir"`` (``--model-dir``) or ``"module"`` (``--module``). ``tracer`` is the
    frontend (``--tracer``). It is a ``str``, so code that prints specs or passes them along needs
    to know nothing of it; a plain ``str`` reads as kind ``auto``, tracer ``export``.
    """

    kind: str
    tracer: str

    def __new__(  # noqa: PYI034 - Self needs Python 3.11
        cls, value: str, kind: str = "auto", tracer: str = "export"
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
    """The tracer a spec asks for: its own for a :class:`ModelSpec`, ``export`` otherwise.

    >>> spec_tracer("opt-125m")
    'export'
    """
    return getattr(spec, "tracer", "export")


__all__ = ["SPEC_KINDS", "TRACERS", "ModelSpec", "spec_kind", "spec_tracer"]
