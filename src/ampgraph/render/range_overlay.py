"""The headroom overlay: each setting's diagram with every box coloured by how far its values are
from overflowing. Torch-free: it recolours what :func:`ampgraph.render.dot.to_dot` draws from the
report (unfolded, so each layer keeps its own colour), with the headroom as plain data.

Colours, by the least headroom of the box's nodes (decades below the dtype's largest finite
number, :data:`BANDS`): red, overflow; orange, less than one decade; yellow, less than two;
green, two or more; the renderer's own grey where no value of the box is 16-bit.

>>> band(-0.2), band(0.5), band(1.5), band(30.0)
('overflow', '< 1 decade', '< 2 decades', '>= 2 decades')
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from ampgraph.ranges.data import RangesResult, SettingRanges
from ampgraph.render.style import HEADROOM_BANDS
from ampgraph.report.records import Report

#: (upper bound in decades, name, border colour, fill colour), least headroom first; kept with
#: the other colours, where Model Explorer's headroom overlay reads them too.
BANDS = HEADROOM_BANDS

#: One box statement of the renderer's source: its id, then its attributes up to the tooltip's end.
_BOX = re.compile(r'^(\s*"(module|op)/([^"]+)" \[)(.*?"\])$', re.M | re.S)
_COLOURS = re.compile(r'color="#\w+" fillcolor="#\w+"')
#: The graph nodes a box stands for, as its tooltip names them.
_MEMBERS = re.compile(r"graph nodes?: ([\w., ]+)")


def band(decades: float) -> str:
    return next(name for bound, name, _, _ in BANDS if decades < bound)


def _colours(decades: float) -> tuple[str, str]:
    return next((line, fill) for bound, _, line, fill in BANDS if decades < bound)


def box_headroom(report: Report, verdict: SettingRanges) -> dict[str, float]:
    """``module/PATH`` -> the least headroom of the module's nodes, and ``node/NAME`` -> each
    node's (a free op's box is coloured by the nodes its tooltip names)."""
    rooms = {f"node/{name}": room for name, room in verdict.headroom.items()}
    for rec in report.nodes:
        room = verdict.headroom.get(rec.name)
        if room is not None and rec.module:
            key = f"module/{rec.module}"
            rooms[key] = min(room, rooms.get(key, room))
    return rooms


def _room(kind: str, path: str, body: str, rooms: Mapping[str, float]) -> float | None:
    if kind == "module":
        return rooms.get(f"module/{path.split('@')[0]}")
    names = [n.strip() for m in _MEMBERS.finditer(body) for n in m.group(1).split(",")]
    found = [rooms[f"node/{n}"] for n in names if f"node/{n}" in rooms]
    return min(found) if found else None


def recolour(source: str, rooms: Mapping[str, float]) -> str:
    """``source`` (Graphviz) with each box that has a headroom filled in its band's colours and
    labelled with it, and a legend node."""

    def paint(m: re.Match[str]) -> str:
        room = _room(m.group(2), m.group(3), m.group(4), rooms)
        if room is None:
            return m.group(0)
        line, fill = _colours(room)
        attrs = f'color="{line}" fillcolor="{fill}" xlabel="{room:+.1f}"'
        body = _COLOURS.sub(attrs, m.group(4), 1)
        return m.group(1) + body

    painted = _BOX.sub(paint, source)
    rows = "".join(
        f'<TR><TD BGCOLOR="{fill}">{name.replace("<", "&lt;").replace(">", "&gt;")}</TD></TR>'
        for _, name, _, fill in BANDS
    )
    legend = (
        '\tranges_legend [shape=plaintext label=<<TABLE BORDER="1" CELLBORDER="0">'
        f"<TR><TD><B>headroom</B> (decades)</TD></TR>{rows}</TABLE>>]\n"
    )
    return painted.rstrip().removesuffix("}") + legend + "}\n"


def overlay_sources(result: RangesResult, title: str | None = None) -> dict[str, str]:
    """Setting name -> the Graphviz source of its headroom overlay, each titled ``title`` (default:
    the model as it was given, ``result.model``: a spec such as ``tests/test_ranges.py:tower``)."""
    from ampgraph.render.dot import to_dot

    return {
        verdict.name: recolour(
            to_dot(report if title is None else replace(report, model=title), fold=False),
            box_headroom(report, verdict),
        )
        for report, verdict in zip(result.reports, result.settings, strict=True)
    }


def write_overlays(result: RangesResult, out_dir: Path, title: str | None = None) -> list[Path]:
    """One SVG per setting, ``MODEL-SETTING-ranges.svg`` in ``out_dir``, titled ``title`` (see
    :func:`overlay_sources`); the paths."""
    from ampgraph.render.files import run_dot, safe_name
    from ampgraph.report.writing import atomic_write

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, source in overlay_sources(result, title).items():
        path = out_dir / f"{safe_name(result.model)}-{safe_name(name)}-ranges.svg"
        atomic_write(path, run_dot(source, "svg"))  # laid out first: no half-written file
        paths.append(path)
    return paths


def write_page(result: RangesResult, out_dir: Path, title: str | None = None) -> Path:
    """The interactive page of every setting (:mod:`ampgraph.render.html`), each node's
    headroom in its annotation: ``MODEL-ranges.html`` in ``out_dir``; its path."""
    from ampgraph.render.files import safe_name
    from ampgraph.render.html import html_page
    from ampgraph.report.writing import atomic_write

    out_dir.mkdir(parents=True, exist_ok=True)
    rooms = {verdict.name: verdict.headroom for verdict in result.settings}
    page = html_page(result.reports, fold=False, headroom=rooms,
                     title=f"{title or result.model}: value-range headroom")  # fmt: skip
    path = out_dir / f"{safe_name(result.model)}-ranges.html"
    atomic_write(path, page.encode("utf-8"))
    return path


__all__ = [
    "BANDS", "band", "box_headroom", "overlay_sources", "recolour", "write_overlays", "write_page",
]  # fmt: skip
