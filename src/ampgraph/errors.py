"""Domain errors. Every message is one line that says what to do next.

The CLI turns these into ``Error: ...`` and exit status 1; anything else is a bug in ampgraph.
"""

from __future__ import annotations

from collections.abc import Iterator


class AmpgraphError(Exception):
    """Base class of the errors a user can cause and fix."""


class SettingError(AmpgraphError, ValueError):
    """A setting, dtype or device name that ampgraph does not understand."""


class ArgumentError(AmpgraphError, TypeError, ValueError):
    """An argument of the Python API of the wrong type or out of range (a ``TypeError`` and a
    ``ValueError`` too, so that either ``except`` catches it)."""


class ModelSpecError(AmpgraphError):
    """An unknown model name, an unreadable config, or a factory that raised."""


class FileReadError(AmpgraphError):
    """A file ampgraph reads that is not a regular file, is too big, or cannot be read."""


class AnalysisError(AmpgraphError):
    """The process that analyses a model ended without a result (killed, out of memory)."""


class CaptureError(AmpgraphError):
    """The model could not be traced into a torch.fx graph."""


class VerifyError(AmpgraphError):
    """Real execution could not be set up (no such device, inputs that do not fit the graph)."""


class NoDeviceError(VerifyError):
    """The setting's device type has no device on this machine."""


class NotDeterministicError(VerifyError):
    """The model's forward does not do the same on every call (it ran when captured, then
    raised when run again for real): verify compares one forward with another, so it cannot
    judge such a model, and says so rather than counting disagreements."""


class RenderError(AmpgraphError):
    """Graphviz is missing or failed to lay a diagram out."""


def first_line(exc: BaseException, default: str | None = None) -> str:
    """The first line of an exception's message, for one-line errors; ``default`` (else the
    exception's type name) when the message is empty.

    >>> first_line(ValueError("bad shape\\n  at line 3")), first_line(KeyError())
    ('bad shape', 'KeyError')
    """
    text = str(exc).strip()
    if text:
        return text.splitlines()[0]
    return type(exc).__name__ if default is None else default


def exception_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc``, then what caused it (``__cause__``, else ``__context__``), and so on, each once
    (a chain can loop).

    >>> try:
    ...     try:
    ...         raise KeyError("inner")
    ...     except KeyError as e:
    ...         raise ValueError("outer") from e
    ... except ValueError as e:
    ...     [type(x).__name__ for x in exception_chain(e)]
    ['ValueError', 'KeyError']
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def clip(value: object, limit: int = 200) -> str:
    """``repr(value)`` cut to about ``limit`` characters, for a hostile value in an error line
    (a 100 kB recipe or setting must not be echoed whole).

    >>> clip("x" * 10), len(clip("x" * 100_000))
    ("'xxxxxxxxxx'", 201)
    """
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}\u2026"
