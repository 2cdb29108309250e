"""The diagrams (SVG, PNG, PDF, Graphviz source, the interactive page, Model Explorer's JSON):
files the renderer writes to a folder, several formats at once; here for
:mod:`ampgraph.formats.registry`, which names them beside the other formats.

>>> from ampgraph.formats.registry import names
>>> names("diagram") == FORMATS
True
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only
    from ampgraph.report.records import Report

#: The renderer's file formats (:data:`ampgraph.render.files.FORMATS`, which a test holds equal).
FORMATS = ("svg", "png", "pdf", "dot", "html", "explorer")


def render_files(
    reports: Sequence[Report], out_dir: Path, *, formats: Sequence[str], **options: Any
) -> list[Path]:
    """:func:`ampgraph.render.render_files`: the files of ``reports`` in ``formats`` in
    ``out_dir``, their paths returned (the renderer, networkx and Graphviz imported now)."""
    from ampgraph.render import render_files as render

    return render(list(reports), out_dir, formats=tuple(formats), **options)  # type: ignore[no-any-return]


def write_sources(source: str, stem: Path, formats: Sequence[str]) -> Iterator[Path]:
    """Graphviz ``source`` (a diagram made beside the report's: ``render --compile inductor``'s
    overlay, an FP8 Linear's flow) written to ``stem.FORMAT`` in each of ``formats``: the source
    as it is for dot, laid out by Graphviz's ``dot`` otherwise; each path as it is written.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as out:
    ...     [p.name for p in write_sources("digraph {}", Path(out) / "a.b", ["dot"])]
    ['a.b.dot']
    """
    from ampgraph.render.files import run_dot
    from ampgraph.report.writing import atomic_write

    for fmt in formats:
        path = stem.parent / f"{stem.name}.{fmt}"
        atomic_write(path, source.encode() if fmt == "dot" else run_dot(source, fmt))
        yield path


__all__ = ["FORMATS", "render_files", "write_sources"]
