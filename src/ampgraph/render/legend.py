"""The legend and the backward's memory panel: the table nodes that explain a diagram.

The legend shows only what its diagram draws (:class:`LegendFacts`): the dtype families on its
edges, the policy fills, and the highlights present (promotion, region, folded layers,
disagreement).

This module is torch-free.

>>> from ampgraph.render.style import THEMES
>>> facts = LegendFacts(frozenset({"fp32"}), region=False, folded=False, disagreement=False)
>>> "edges: dtype" in legend_label(facts, THEMES["light"])
True
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import graphviz
import networkx as nx

from ampgraph.policy import CATEGORY_LABEL
from ampgraph.render.labels import dot_name, html_text, write_edge
from ampgraph.render.style import (
    DISAGREEMENT_MARK,
    FAMILY_LABEL,
    FAMILY_ORDER,
    FOLD_MARK,
    POLICY_ORDER,
    PROMOTION_MARK,
    SMALL_FONT_SIZE,
    NodeStyle,
    Theme,
    dtype_family,
)
from ampgraph.settings import short_dtype
from ampgraph.report.memory import human_bytes


@dataclass(frozen=True)
class LegendFacts:
    """What the legend has to explain: the dtype families drawn and the highlights present."""

    families: frozenset[str]
    region: bool
    folded: bool
    disagreement: bool

    @classmethod
    def of(cls, graphs: Iterable[nx.MultiDiGraph]) -> LegendFacts:
        families = {"fp32"}
        region = folded = disagreement = False
        for graph in graphs:
            families |= {dtype_family(key) for _, _, key in graph.edges(keys=True)}
            amp = graph.graph["setting"].get("amp_dtype")
            if amp:
                families.add(dtype_family(amp))  # the 16-bit colour, even where none flows
            clusters = graph.graph["clusters"].values()
            region |= any(c["kind"] == "region" for c in clusters)
            folded |= any(c["count"] > 1 for c in clusters)
            disagreement |= any(d["disagree"] or d["error"] for _, d in graph.nodes(data=True))
        return cls(frozenset(families), region, folded, disagreement)


def legend_label(facts: LegendFacts, theme: Theme) -> str:
    """The legend as one HTML table: dtype colours, policy fills, highlights."""
    families = facts.families
    edge_rows = ['<TR><TD COLSPAN="2" ALIGN="LEFT"><B>edges: dtype</B></TD></TR>']
    for family in FAMILY_ORDER:
        if family not in families:
            continue
        edge = theme.edges[family]
        dash = (
            " (dashed)" if edge.style == "dashed" else " (dotted)" if edge.style == "dotted" else ""
        )
        edge_rows.append(
            f"<TR><TD>{_line_sample(edge.colour, edge.style)}</TD>"
            f'<TD ALIGN="LEFT">{html_text(FAMILY_LABEL[family] + dash)}</TD></TR>'
        )
    box_rows = ['<TR><TD COLSPAN="2" ALIGN="LEFT"><B>boxes: autocast policy</B></TD></TR>']
    for key in POLICY_ORDER:
        label = CATEGORY_LABEL.get(key, key)
        if key == "none":
            label = "none (runs in its inputs' dtype)"
        box_rows.append(_swatch_row(theme.policies[key], html_text(label)))
    mark_rows = ['<TR><TD COLSPAN="2" ALIGN="LEFT"><B>highlights</B></TD></TR>']
    mark_rows.append(
        _swatch_row(theme.promotion, f"<B>{PROMOTION_MARK} promotion</B>: mixed inputs widen")
    )
    if facts.region:
        mark_rows.append(
            _swatch_row(NodeStyle(theme.region_fill, theme.region_border), "autocast region")
        )
    if facts.folded:
        mark_rows.append(
            _swatch_row(
                NodeStyle(theme.fold_fill, theme.fold_border), f"{FOLD_MARK}N: N identical layers"
            )
        )
    if facts.disagreement:
        mark_rows.append(
            _swatch_row(theme.disagreement, f"{DISAGREEMENT_MARK} dispatcher disagrees / error")
        )
    # Two columns (dtypes and highlights | policies): a short, wide legend fits beside the
    # model's narrow tail without stretching its last edge.
    left = _inner_table(edge_rows + mark_rows)
    right = _inner_table(box_rows)
    return (
        f'<<TABLE BORDER="1" COLOR="{theme.muted}" CELLBORDER="0" CELLSPACING="0" '
        f'CELLPADDING="4" BGCOLOR="{theme.background}"><TR>'
        f'<TD VALIGN="TOP">{left}</TD><TD VALIGN="TOP">{right}</TD></TR></TABLE>>'
    )


def _inner_table(rows: list[str]) -> str:
    return (
        '<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="2" CELLPADDING="1">'
        + "".join(rows)
        + "</TABLE>"
    )


def _line_sample(colour: str, style: str) -> str:
    """A short horizontal line in an edge's colour (dashed lines as separate segments)."""
    segments = {"solid": 1, "dashed": 3, "dotted": 5}.get(style, 1)
    width = 30 if segments == 1 else (30 - 2 * (segments - 1)) // segments
    cells = '<TD WIDTH="2" HEIGHT="3" FIXEDSIZE="TRUE"></TD>'.join(
        f'<TD BGCOLOR="{colour}" WIDTH="{width}" HEIGHT="3" FIXEDSIZE="TRUE"></TD>'
        for _ in range(segments)
    )
    return (
        f'<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="0"><TR>{cells}</TR></TABLE>'
    )


def _swatch_row(style: NodeStyle, text: str) -> str:
    swatch = (
        f'<TABLE BORDER="1" CELLBORDER="0" CELLSPACING="0" CELLPADDING="0" COLOR="{style.border}">'
        f'<TR><TD BGCOLOR="{style.fill}" WIDTH="26" HEIGHT="11" FIXEDSIZE="TRUE"></TD></TR></TABLE>'
    )
    return f'<TR><TD>{swatch}</TD><TD ALIGN="LEFT">{text}</TD></TR>'


def add_legend(
    dot: graphviz.Digraph,
    facts: LegendFacts,
    theme: Theme,
    beside: Sequence[str],
    *,
    same_rank: bool = True,
) -> None:
    """The legend beside the model's last box (its narrow tail, where it widens the figure
    least), or below the given boxes with ``same_rank=False``.

    ``rank=same`` needs the legend in the same component as the node it sits beside, hence the
    invisible edges.
    """
    with dot.subgraph(name="legend_rank") as legend:
        if beside and same_rank:
            legend.attr(rank="same")
        legend.node(
            "legend",
            id="legend",
            label=legend_label(facts, theme),
            tooltip="legend: edge colours are dtypes, box fills autocast policies",
            shape="plain",
            fontcolor=theme.text,
            fontsize=str(SMALL_FONT_SIZE + 1),
        )
        if beside and same_rank:
            legend.node(dot_name(beside[0]))
    for node in beside:
        write_edge(dot, node, "legend", style="invis")


#: Column order of the memory panel: fp32 first, the 16-bit dtypes, then anything else.
MEMORY_DTYPES: Final = ("float32", "bfloat16", "float16")


def memory_label(rows: Sequence[tuple[str, dict[str, int]]], theme: Theme) -> str:
    """The saved-for-backward panel: one row per layer, one column per dtype, and a total.

    Consecutive layers that save the same (OPT's twelve decoder layers) share one row, so the
    panel stays short and still says how much each one keeps.
    """
    dtypes = [d for d in MEMORY_DTYPES if any(d in r for _, r in rows)]
    dtypes += sorted({d for _, r in rows for d in r} - set(dtypes))
    merged: list[tuple[str, dict[str, int], int, str]] = []
    for name, row in rows:
        if merged and merged[-1][1] == row and _same_list(merged[-1][0], name):
            first, _, count, _ = merged[-1]
            merged[-1] = (first, row, count + 1, name)
        else:
            merged.append((name, row, 1, name))
    head = "".join(f"<TD><B>{html_text(short_dtype(d))}</B></TD>" for d in dtypes)
    cells = [
        f'<TR><TD COLSPAN="{len(dtypes) + 1}"><B>saved for backward</B></TD></TR>',
        f'<TR><TD ALIGN="LEFT"><B>layer</B></TD>{head}</TR>',
    ]
    for name, row, count, last in merged:
        # "layers.0–11, each": the range of identical layers, and that the bytes are per layer.
        label = name if count == 1 else f"{name}–{last.rpartition('.')[2]}, each"
        values = "".join(
            f'<TD ALIGN="RIGHT">{html_text(human_bytes(row[d])) if d in row else "–"}</TD>'
            for d in dtypes
        )
        cells.append(f'<TR><TD ALIGN="LEFT">{html_text(label)}</TD>{values}</TR>')
    totals = {d: sum(r.get(d, 0) for _, r in rows) for d in dtypes}
    values = "".join(
        f'<TD ALIGN="RIGHT"><B>{html_text(human_bytes(totals[d]))}</B></TD>' for d in dtypes
    )
    cells.append(f'<TR><TD ALIGN="LEFT"><B>total</B></TD>{values}</TR>')
    return (
        f'<<TABLE BORDER="1" CELLBORDER="0" CELLSPACING="0" CELLPADDING="3" '
        f'COLOR="{theme.muted}">{"".join(cells)}</TABLE>>'
    )


def _same_list(first: str, name: str) -> bool:
    """Whether two layer names are items of one list (``layers.0``, ``layers.1``)."""
    return first.rpartition(".")[0] == name.rpartition(".")[0] and name.rpartition(".")[2].isdigit()


def add_memory_panel(
    dot: graphviz.Digraph, rows: Sequence[tuple[str, dict[str, int]]], theme: Theme
) -> None:
    """The saved-activation memory per layer and dtype, a table node beside the legend."""
    dot.node(
        "memory",
        id="memory",
        label=memory_label(rows, theme),
        tooltip="memory autograd keeps for backward (activations and 16-bit parameter copies), "
        "per layer and dtype, each storage counted once",
        shape="plain",
        fontcolor=theme.text,
        fontsize=str(SMALL_FONT_SIZE + 1),
    )
    dot.edge("legend", "memory", style="invis")
