"""The one registry of output formats: for each kind of result, its format names and each one's writer.

A command looks its output up here (:func:`write`, or :func:`text` for the string) and takes its
``--format`` choices from :func:`names`, so that ``--help`` and what can be written cannot
disagree. A writer returns the command's whole output, its line ends included: the command
adds nothing. Writers are named as ``module:function`` under :mod:`ampgraph.formats` and
imported when used, so that reading the names (the command line, starting) costs no import.

>>> names("diff")
('text', 'markdown', 'json')
>>> from ampgraph.review.diff import ReportDiff
>>> text("diff", "json", ReportDiff({}, {})).endswith("}\\n")
True
>>> names("nothing")
Traceback (most recent call last):
...
KeyError: "no output kind 'nothing'"
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ampgraph.formats.diagrams import FORMATS
from ampgraph.report.escape import terminal


@dataclass(frozen=True)
class Writer:
    """One format of one kind: ``module:function`` of :mod:`ampgraph.formats`, and how its text
    is printed.

    ``end`` follows the function's text (a line end, or none where the text ends in its own);
    ``shown`` passes it through :func:`~ampgraph.report.escape.terminal` (control characters in
    module names shown, never run, where a person reads it); ``warning`` is a ``module:function``
    giving a line for standard error, or None for no line.
    """

    target: str
    end: str = "\n"
    shown: bool = False
    warning: str | None = None

    def __call__(self, result: Any, **options: Any) -> str:
        out = _load(self.target)(result, **options)
        return (terminal(out) if self.shown else out) + self.end


def _load(target: str) -> Callable[..., Any]:
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(f"ampgraph.formats.{module}"), function)  # type: ignore[no-any-return]


_NONE = Writer("outputs:nothing", end="")

#: Every kind of result a command writes, and its formats in the order ``--help`` lists them.
REGISTRY: dict[str, dict[str, Writer]] = {
    "table": {
        "text": Writer("outputs:table_text", end=""),
        "json": Writer("outputs:table_json"),
        "markdown": Writer("outputs:table_markdown", end=""),
    },
    "check": {
        "text": Writer("outputs:check_text", end=""),
        "json": Writer("outputs:check_json"),
        "markdown": Writer("outputs:check_markdown"),
    },
    # verify's lines of each setting as it comes (text), then the whole run.
    "verify-setting": {"text": Writer("outputs:verify_setting_text", end=""), "json": _NONE},
    "verify": {"text": Writer("outputs:verify_text", end=""), "json": Writer("outputs:verify_json")},
    "audit": {
        "text": Writer("outputs:audit_text", shown=True),
        "json": Writer("outputs:audit_json"),
        "markdown": Writer("outputs:audit_markdown", shown=True),
        "sarif": Writer("outputs:audit_sarif", warning="outputs:audit_sarif_warning"),
    },
    "diff": {
        "text": Writer("diff_text:diff_text", shown=True),
        "markdown": Writer("markdown:diff_markdown", shown=True),
        "json": Writer("json:diff_json"),
    },
    "baseline-check": {
        "text": Writer("outputs:baseline_text", end=""),
        "markdown": Writer("outputs:baseline_markdown", end=""),
        "json": Writer("outputs:baseline_json", end=""),
    },
    # the file ``baseline write`` (and ``check --update``) writes, and the line saying so
    "baseline": {"json": Writer("json:baseline_file", end="")},
    "baseline-written": {"text": Writer("listing:baseline_written_text", end="")},
    "ranges": {
        "text": Writer("text:ranges_text", end=""),
        "json": Writer("json:ranges_json"),
        "markdown": Writer("markdown:ranges_markdown", end=""),
        "sarif": Writer("sarif:ranges_sarif"),
    },
    "ranges-diff": {
        "text": Writer("diff_text:ranges_diff_text", end=""),
        "json": Writer("json:ranges_diff_json"),
    },
    "compiled": {
        "table": Writer("compiled:table_text"),
        "diff": Writer("compiled:diff_text"),
        "audit": Writer("compiled:audit_text"),
        "json": Writer("compiled:flow_json"),
    },
    "compiled-train": {
        "table": Writer("compiled_train:step_table"),
        "diff": Writer("compiled_train:step_diff"),
        "audit": Writer("compiled_train:step_audit"),
        "json": Writer("compiled_train:step_json"),
    },
    # the compile axis of the setting commands (--compile inductor)
    "compiled-table": {
        "text": Writer("compiled:flows_table_text"),
        "json": Writer("compiled:flows_table_json"),
        "markdown": Writer("compiled:flows_table_markdown"),
    },
    "compiled-audit": {
        "text": Writer("compiled:findings_text"),
        "json": Writer("compiled:findings_json"),
    },
    "compiled-check": {"text": Writer("compiled:check_text"), "json": Writer("compiled:check_json")},
    "compiled-diff": {"text": Writer("compiled:sides_text"), "json": Writer("compiled:sides_json")},
    "fp8": {"text": Writer("fp8:fp8_text"), "json": Writer("fp8:fp8_json")},
    # fp8 --dot's module flow (and each FP8 Linear's diagram of render --recipe torchao:...)
    "fp8-dot": {"dot": Writer("fp8:flow_dot", end="")},
    "fp8-ranges": {"text": Writer("fp8:survival_text"), "json": Writer("fp8:survival_json")},
    # the file fp8-ranges --advise --write-filter writes
    "fp8-filter": {"python": Writer("fp8:filter_code")},
    # --recipe torchao:... on the setting commands and diff
    "fp8-table": {
        "text": Writer("fp8:table_text"),
        "json": Writer("fp8:table_json"),
        "markdown": Writer("fp8:table_markdown"),
    },
    "fp8-check": {
        "text": Writer("fp8:proof_text"),
        "json": Writer("fp8:proof_json"),
        "markdown": Writer("fp8:proof_text"),
    },
    "fp8-audit": {
        "text": Writer("fp8:findings_text", shown=True),
        "json": Writer("fp8:findings_json"),
        "markdown": Writer("fp8:findings_markdown", shown=True),
    },
    "fp8-diff": {
        "text": Writer("fp8:recipes_diff_text", shown=True),
        "json": Writer("fp8:recipes_diff_json"),
        "markdown": Writer("fp8:recipes_diff_markdown", shown=True),
    },
    "policy": {
        "text": Writer("policy:to_text"),
        "markdown": Writer("policy:to_markdown"),
        "json": Writer("policy:to_json"),
    },
    "policy-changes": {
        "text": Writer("policy:changes_text"),
        "markdown": Writer("policy:changes_markdown"),
        "json": Writer("policy:changes_json"),
    },
    "models": {"text": Writer("listing:models_text", end="")},
    "cache-info": {"text": Writer("listing:cache_info_text", end="")},
    "cache-clear": {"text": Writer("listing:cache_clear_text", end="")},
    # the files a command wrote (render's diagrams), one a line
    "paths": {"text": Writer("listing:paths_text", end="")},
    # ranges --overlay's files, after the ranges' output: on stdout beside text, on stderr
    # beside a format a program reads
    "overlays": {
        "text": Writer("listing:overlays_text", end=""),
        "json": Writer("outputs:nothing", end="", warning="listing:overlays_note"),
        "markdown": Writer("outputs:nothing", end="", warning="listing:overlays_note"),
        "sarif": Writer("outputs:nothing", end="", warning="listing:overlays_note"),
    },
}

#: The kinds written as files to a folder, several formats at once, not to a stream: their names
#: (``render``'s diagrams: :func:`ampgraph.formats.diagrams.render_files` writes them).
FILES: dict[str, tuple[str, ...]] = {"diagram": FORMATS}


def _kind(kind: str) -> dict[str, Writer]:
    try:
        return REGISTRY[kind]
    except KeyError:
        raise KeyError(f"no output kind {kind!r}") from None


def names(kind: str) -> tuple[str, ...]:
    """The format names of ``kind``, in the order ``--help`` lists them: a command's
    ``--format`` choices.

    >>> names("diagram")
    ('svg', 'png', 'pdf', 'dot', 'html', 'explorer')
    """
    return FILES[kind] if kind in FILES else tuple(_kind(kind))


def writer(kind: str, fmt: str) -> Writer:
    """The writer of ``kind`` in ``fmt``; a KeyError that names both where there is none."""
    try:
        return _kind(kind)[fmt]
    except KeyError:
        raise KeyError(f"{kind} has no format {fmt!r}: {', '.join(_kind(kind))}") from None


def text(kind: str, fmt: str, result: Any, **options: Any) -> str:
    """The whole output of ``result`` (a ``kind``) in ``fmt``, line ends included."""
    return writer(kind, fmt)(result, **options)


def warning(kind: str, fmt: str, result: Any, **options: Any) -> str | None:
    """The line for standard error that goes with ``text(kind, fmt, result)``, or None."""
    target = writer(kind, fmt).warning
    return None if target is None else _load(target)(result, **options)  # type: ignore[no-any-return]


def write_file(kind: str, fmt: str, result: Any, path: Path, **options: Any) -> None:
    """Write ``result`` (a ``kind``) in ``fmt`` to the file ``path``, atomically
    (:func:`~ampgraph.report.writing.atomic_write`: a reader never sees half of it); an
    :class:`OSError` where it cannot be written."""
    from ampgraph.report.writing import atomic_write

    atomic_write(path, text(kind, fmt, result, **options).encode())


def write(kind: str, fmt: str, result: Any, out: TextIO | None = None, **options: Any) -> None:
    """Write ``result`` (a ``kind``) in ``fmt`` to ``out`` (standard output by default), and its
    warning line, where it has one, to standard error."""
    (out or sys.stdout).write(text(kind, fmt, result, **options))
    line = warning(kind, fmt, result, **options)
    if line is not None:
        sys.stderr.write(line + "\n")


__all__ = [
    "FILES", "REGISTRY", "Writer", "names", "text", "warning", "write", "write_file", "writer",
]  # fmt: skip
