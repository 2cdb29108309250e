"""The overview: several settings' diagrams in one figure, a grid of compact, framed cells.

The seed's four settings make its 2x2 matrix (rows the parameter dtype, columns autocast off and
on); other sets are laid out in rows of two. Each cell is a compact module view headed by its
setting and its counts of autocast casts and promotions.

This module is torch-free.

>>> from ampgraph.report.records import Report
>>> report = Report.from_json(open("tests/data/opt-125m-amp-fp32.json").read())
>>> overview_dot([report]).splitlines()[0]
'digraph overview {'
"""

from __future__ import annotations

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
from ampgraph.render.style import FONT_SIZE, PROMOTION_MARK, THEMES, Theme
from ampgraph.render.tooltips import describe, title_text

if TYPE_CHECKING:  # only read: the records module imports the renderer for notebooks
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


def _add_cell(target: graphviz.Digraph, emitter: Emitter, theme: Theme) -> None:
    """One framed cell: its title inside the frame, padded off the border, and the diagram."""
    graph = emitter.graph
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
            margin="16",
        )
        emitter.emit(cell)


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
    dot = new_digraph("overview", title, subtitle, th)
    emitters: list[list[Emitter]] = []
    graphs = []
    for row in grid:
        emitters.append([])
        for report in row:
            graph = build_graph(report, view=view, fold=fold)
            graphs.append(graph)
            emitters[-1].append(Emitter(graph, th, prefix=prefixes[id(report)], compact=True))
    for row_emitters in emitters:
        for emitter in row_emitters:
            _add_cell(dot, emitter, th)
    # Align the rows: each row's cells start on the same rank.
    for r_i, row_emitters in enumerate(emitters):
        firsts = [e.first() for e in row_emitters if e.first()]
        if len(firsts) > 1:
            with dot.subgraph(name=f"row_{r_i}") as same:
                same.attr(rank="same")
                for node in firsts:
                    same.node(dot_name(str(node)))
    # Stack the rows: an invisible edge from each cell's last box to the first box of the cell
    # below puts the two in one column (dot lays unconnected columns side by side, in order).
    for r_i in range(1, len(emitters)):
        for c_i, below in enumerate(emitters[r_i]):
            above = emitters[r_i - 1][c_i] if c_i < len(emitters[r_i - 1]) else None
            if above is not None and above.last() and below.first():
                write_edge(
                    dot,
                    str(above.last()),
                    str(below.first()),
                    style="invis",
                    weight="50",
                    minlen="2",
                )
    bottom = [e.last() for e in emitters[-1] if e.last()]
    add_legend(dot, LegendFacts.of(graphs), th, [str(b) for b in bottom], same_rank=False)
    description = " ".join(
        f"Cell {prefixes[id(r)].rstrip('/')}: {describe(g)}"
        for r, g in zip([r for row in grid for r in row], graphs)
    )
    return Diagram(dot.source, title, description)
