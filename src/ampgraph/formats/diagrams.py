"""The diagrams (SVG, PNG, PDF, Graphviz source, the interactive page, Model Explorer's JSON):
files the renderer writes to a folder, several formats at once; here for
:mod:`ampgraph.formats.registry`, which names them beside the other formats.

>>> from ampgraph.formats.registry import names
>>> names("diagram") == FORMATS
True
"""

from __future__ import annotations

from collections.abc import Sequence
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


__all__ = ["FORMATS", "render_files"]
