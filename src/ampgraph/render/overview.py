"""The overview: several settings' diagrams in one figure, a grid of compact, framed cells.

The seed's four settings make its 2x2 matrix (rows the parameter dtype, columns autocast off and
on); other sets are laid out in rows of two. Each cell is a compact module view headed by its
setting and its counts of autocast casts and promotions. The grid is exact: each cell lies
between two invisible spacers as wide as its column's widest cell (measured by laying the
figure out once before), a row's spacers share ranks and a column's stand one above the other.

This module is torch-free.

>>> from ampgraph.report.records import Report
>>> report = Report.from_json(open("tests/data/opt-125m-amp-fp32.json").read())
>>> overview_dot([report]).splitlines()[0]
'digraph overview {'
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import graphviz
import networkx as nx

from ampgraph.errors import RenderError
from ampgraph.render.dot import Diagram, check_theme
from ampgraph.render.emit import Emitter, new_digraph
from ampgraph.render.graph import build_graph
from ampgraph.render.labels import dot_name, dot_string, font, html_text, write_edge
from ampgraph.render.legend import LegendFacts, add_legend
from ampgraph.render.style import DOT_TIMEOUT_S, FONT_SIZE, PROMOTION_MARK, THEMES, Theme
from ampgraph.render.tooltips import describe, title_text

if TYPE_CHECKING:  # only for annotations: records are plain data the renderer reads, never builds
    from ampgraph.report.records import Report


#: The seed's 2x2 matrix: rows are the parameter dtype, columns autocast off/on.
SEED_GRID: Final = (("fp32", "amp-fp32"), ("half", "amp-half"))


def overview_grid(reports: Sequence[Report]) -> list[list[Report]]:
    """Reports arranged in rows of two: the seed's matrix when they are its four settings.

    >>> from ampgraph.report.records import Report
    >>> def rep(name): return Report("m", {"name": name}, {}, {}, [], [])
    >>> [[r.setting["name"] for r in row] for row in overview_grid(
    ...     [rep("fp32"), rep("half"), rep("amp-half"), rep("amp-fp32")])]
    [['fp32', 'amp-fp32'], ['half', 'amp-half']]
    """
    by_name = {r.setting.get("name"): r for r in reports}
    seed = [name for row in SEED_GRID for name in row]
    if (
        len(reports) == 4
        and sorted(by_name) == sorted(seed)
        and len({r.model for r in reports}) == 1
    ):
        return [[by_name[n] for n in row] for row in SEED_GRID]
    return [list(reports[i : i + 2]) for i in range(0, len(reports), 2)]


def _cell_label(graph: nx.MultiDiGraph, theme: Theme) -> str:
    counts = graph.graph["counts"]
    promotions = counts["promotions"]
    facts = f"autocast casts: {counts['casts']} · promotions: {promotions}"
    facts_html = font(html_text(facts), colour=theme.muted, size=FONT_SIZE)
    if promotions:
        facts_html = font(
            html_text(f"autocast casts: {counts['casts']} · ")
            + f"<B>{PROMOTION_MARK} promotions: {promotions}</B>",
            colour=theme.promotion.border,
            size=FONT_SIZE,
        )
    caption = title_text(graph).split(" — ", 1)[-1]
    # A table with padding: dot makes a cluster only as wide as its label, so a bare label as
    # wide as the cell's diagram ran into the frame on both sides.
    return (
        f'<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="{CELL_TITLE_PAD}">'
        f"<TR><TD><B>{html_text(caption)}</B><BR/>{facts_html}</TD></TR></TABLE>>"
    )


def _cell_prefixes(reports: Sequence[Report]) -> list[str]:
    """Id prefixes of the overview's cells: the setting's name (``amp-fp32/``), with the model
    where several models share a name, so ids stay unique and readable."""
    names = [str(r.setting.get("name", "")) for r in reports]
    if len(set(names)) < len(names):
        names = [f"{r.model}/{n}" for r, n in zip(reports, names)]
    if len(set(names)) < len(names):
        names = [f"{n}.{i}" for i, n in enumerate(names)]
    return [f"{n}/" for n in names]


#: Room around a cell's title, in points, off the cell's frame.
CELL_TITLE_PAD: Final = "10"
#: Room between a cell's frame and its boxes, in points (its spacers' ends touch it).
CELL_MARGIN: Final = 16
#: The gap between two cells of a row, in ``nodesep`` units less the two cells' margins: 3 x
#: 0.3 in, 65 points between the spacers' ends, leaves 33 points between the frames.
COLUMN_GAP_NODESEPS: Final = "3"
#: Points a spacer is wider than its column's widest cell was measured: room for rounding.
SPACER_SLACK: Final = 2.0


def _spacer(target: graphviz.Digraph, name: str, width: float) -> None:
    """An invisible box ``width`` points wide and next to no height: a cell's head or foot."""
    target.node(
        dot_name(name),
        label="",
        shape="box",
        style="invis",
        fixedsize="true",
        width=f"{width / 72:.4f}",
        height="0.01",
    )


def _add_cell(
    target: graphviz.Digraph, emitter: Emitter, theme: Theme, width: float
) -> tuple[str, str]:
    """One framed cell: its title inside the frame, padded off the border, and the diagram
    between two spacers ``width`` points wide; returns the spacers' names (head, foot).

    The head is above every box of the cell and the foot below, each alone on its rank, so a
    cell's frame is its spacers' width plus its margin wherever its boxes lie, and the overview
    lines its cells up by lining the spacers up.
    """
    graph = emitter.graph
    head, foot = f"{emitter.prefix}cell/head", f"{emitter.prefix}cell/foot"
    with target.subgraph(name=dot_name(f"cluster_{emitter.prefix}cell")) as cell:
        cell.attr(
            id=dot_name(f"{emitter.prefix}cell"),
            label=_cell_label(graph, theme),
            tooltip=dot_string(describe(graph)),
            labeljust="c",
            fontsize="14",
            fontcolor=theme.text,
            style="rounded",
            color=theme.muted,
            penwidth="1.2",
            margin=str(CELL_MARGIN),
        )
        _spacer(cell, head, width)
        emitter.emit(cell)
        _spacer(cell, foot, width)
    order = sorted(graph.nodes, key=lambda n: graph.nodes[n]["order"])
    sources = [n for n in order if not graph.in_degree(n)]
    sinks = [n for n in order if not graph.out_degree(n)]
    for node in sources:
        write_edge(target, head, emitter.node_id(node), style="invis")
    for node in sinks:
        write_edge(target, emitter.node_id(node), foot, style="invis")
    if not order:
        write_edge(target, head, foot, style="invis")
    return head, foot


def _cell_widths(source: str, prefixes: Sequence[str]) -> dict[str, float]:
    """The frames' widths in points, by cell prefix, as ``dot`` lays ``source`` out; empty
    where Graphviz is not installed (the cells are then drawn as wide as their boxes)."""
    dot = shutil.which("dot")
    if dot is None:
        return {}
    try:
        proc = subprocess.run(
            [dot, "-Tjson0"], input=source.encode("utf-8"), capture_output=True,
            timeout=DOT_TIMEOUT_S, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}  # the layout proper reports the failure
    names = {f"cluster_{p}cell": p for p in prefixes}
    widths = {}
    for obj in json.loads(proc.stdout).get("objects", []):
        if obj.get("name") in names and "bb" in obj:
            x0, _, x1, _ = (float(v) for v in obj["bb"].split(","))
            widths[names[obj["name"]]] = x1 - x0
    return widths


def overview_dot(
    reports: Sequence[Report], *, view: str = "modules", fold: bool = True, theme: str = "light"
) -> str:
    """One figure with every report's diagram in a compact form: the seed's 2x2 matrix.

    Rows are the parameter dtype (fp32, then 16-bit), columns autocast off and on. Each cell is
    a framed, compact module view (names and dtype lines; the per-setting files have the casts,
    and every box's tooltip the full record) headed by the setting and its count of autocast
    casts and promotions. Element ids are the cells' ids prefixed with the setting's name.
    """
    return overview_diagram(reports, view=view, fold=fold, theme=theme).source


def overview_diagram(
    reports: Sequence[Report], *, view: str = "modules", fold: bool = True, theme: str = "light"
) -> Diagram:
    """:func:`overview_dot`'s source with its title and description."""
    check_theme(theme)
    if not reports:
        raise RenderError("nothing to draw: no reports were given")
    th = THEMES[theme]
    grid = overview_grid(reports)
    models = list(dict.fromkeys(r.model for r in reports))
    seed = len(reports) == 4 and grid[0][0].setting.get("name") == "fp32"
    title = f"{', '.join(models)} — " + (
        "autocast off / on × parameters fp32 / 16-bit" if seed else f"{len(reports)} settings"
    )
    subtitle = (
        "each cell: "
        + ("module view" if view == "modules" else "op view")
        + (", identical layers drawn once" if fold else "")
        + " · edges coloured and labelled by dtype"
    )
    prefixes = dict(zip(map(id, reports), _cell_prefixes(reports)))
    graphs = [[build_graph(r, view=view, fold=fold) for r in row] for row in grid]
    emitters = [
        [Emitter(g, th, prefix=prefixes[id(r)], compact=True) for r, g in zip(row, g_row)]
        for row, g_row in zip(grid, graphs)
    ]
    # Laid out once with spacers of no width to measure the cells, then with each column's
    # spacers as wide as its widest cell: every frame of a column is then exactly as wide.
    dot = _grid(new_digraph("overview", title, subtitle, th), emitters, th, {})
    measured = _cell_widths(dot.source, list(prefixes.values()))
    if measured:
        widths: dict[str, float] = {}
        for c_i in range(max(map(len, emitters))):
            column = [row[c_i].prefix for row in emitters if c_i < len(row)]
            widest = max(measured.get(p, 0.0) for p in column) - 2 * CELL_MARGIN
            widths.update(dict.fromkeys(column, max(widest, 0.0) + SPACER_SLACK))
        dot = _grid(new_digraph("overview", title, subtitle, th), emitters, th, widths)
    flat = [g for row in graphs for g in row]
    description = " ".join(
        f"Cell {prefixes[id(r)].rstrip('/')}: {describe(g)}"
        for r, g in zip([r for row in grid for r in row], flat)
    )
    return Diagram(dot.source, title, description)


def _grid(
    dot: graphviz.Digraph, emitters: list[list[Emitter]], theme: Theme, widths: dict[str, float]
) -> graphviz.Digraph:
    """The cells in ``dot``, a grid: a row's heads on one rank and its feet on one, a column's
    spacers one above the other, the legend below; spacers ``widths[prefix]`` points wide."""
    spacers = [
        [_add_cell(dot, e, theme, widths.get(e.prefix, 0.0)) for e in row] for row in emitters
    ]
    for r_i, row in enumerate(spacers):
        for end in (0, 1):  # the heads, then the feet
            with dot.subgraph(name=f"row_{r_i}_{'foot' if end else 'head'}") as same:
                same.attr(rank="same")
                for cell in row:
                    same.node(dot_name(cell[end]))
            # A flat edge keeps the columns in order, left to right, with a gap between.
            for left, right in itertools.pairwise(row):
                write_edge(dot, left[end], right[end], style="invis", minlen=COLUMN_GAP_NODESEPS)
    # A column's foot above the head of the cell below: one x, so their frames line up.
    for above, below in itertools.pairwise(spacers):
        for (_, foot), (head, _) in zip(above, below):
            write_edge(dot, foot, head, style="invis", weight="1000", minlen="2")
    graphs = [e.graph for row in emitters for e in row]
    add_legend(
        dot, LegendFacts.of(graphs), theme, [foot for _, foot in spacers[-1]], same_rank=False
    )
    return dot
