"""From the diagram graph (:mod:`ampgraph.render.graph`) to Graphviz source text.

Labels are Graphviz HTML-like labels; colours and shapes come from :mod:`ampgraph.render.style`.
Output is deterministic: nodes are written in execution order inside their clusters, edges in the
order of their endpoints, and nothing depends on dict or set iteration order of the input.

This module is torch-free.

>>> import networkx as nx
>>> g = nx.MultiDiGraph(model="m", setting={"name": "fp32", "device_type": "cuda",
...     "autocast": False, "amp_dtype": "bfloat16", "param_dtype": "float32"},
...     view="modules", fold=True, check=None, clusters={})
>>> "digraph" in graph_to_dot(g)
True
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import graphviz
import networkx as nx

from ampgraph.errors import RenderError
from ampgraph.train.memory import human_bytes
from ampgraph.policy import CATEGORY_LABEL
from ampgraph.render.graph import build_graph
from ampgraph.render.style import (
    DIFFERS_MARK,
    DISAGREEMENT_MARK,
    FAMILY_LABEL,
    FAMILY_ORDER,
    FOLD_MARK,
    FONT,
    FONT_SIZE,
    GRAPH_ATTRS,
    POLICY_ORDER,
    POLICY_STYLE_KEY,
    PROMOTION_MARK,
    SMALL_FONT_SIZE,
    THEMES,
    TITLE_FONT_SIZE,
    NodeStyle,
    Theme,
    dtype_family,
    is_floating,
)
from ampgraph.render.svg import xml_chars
from ampgraph.settings import Setting, short_dtype

if TYPE_CHECKING:  # only read: the records module imports the renderer for notebooks
    from ampgraph.report.records import Report

ARROW: Final = "→"
#: SVG collapses runs of spaces; labels that need room between words use no-break spaces.
NBSP: Final = "&#160;"
#: Room between a cluster's frame and its boxes; thick promotion borders need more than the default 8.
CLUSTER_MARGIN: Final = "14"


def _h(text: str) -> str:
    """Escape text for an HTML-like label (Graphviz parses it as XML: a control character in a
    module's name would make it refuse the label)."""
    return escape(xml_chars(text, breaks=False), quote=True)


def _font(text: str, *, colour: str | None = None, size: int | None = None) -> str:
    attrs = ""
    if colour:
        attrs += f' COLOR="{colour}"'
    if size:
        attrs += f' POINT-SIZE="{size}"'
    return f"<FONT{attrs}>{text}</FONT>" if attrs else text


def _table(rows: Iterable[str], *, align: str = "CENTER") -> str:
    body = "".join(f'<TR><TD ALIGN="{align}">{row}</TD></TR>' for row in rows)
    return f'<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="1">{body}</TABLE>>'


def _dtype_list(dtypes: Sequence[str | None]) -> str:
    return ", ".join(dict.fromkeys(short_dtype(d) for d in dtypes)) or "-"


def flow_text(data: dict[str, Any]) -> str:
    """The dtype line of a box: ``fp32 → bf16``, or ``fp32 + bf16 → fp32`` for a binary op.

    >>> flow_text({"kind": "op", "op": "add", "in_dtypes": ("float32", "bfloat16"),
    ...            "out_dtype": "float32", "promotion": None})
    'fp32 + bf16 → fp32'
    """
    out = short_dtype(data["out_dtype"])
    kind = data["kind"]
    if kind in ("input", "region") or (kind == "op" and not data["in_dtypes"]):
        return out
    if kind == "output":
        return _dtype_list(data["in_dtypes"])
    ins: Sequence[str | None] = data["in_dtypes"]
    if data.get("promotion") and kind == "op":
        ins = data["promotion"][0]
    if kind == "op" and data.get("op") in _OP_SIGN and len(ins) == 2:
        sign = _OP_SIGN[data["op"]]
        return f"{short_dtype(ins[0])} {sign} {short_dtype(ins[1])} {ARROW} {out}"
    if kind == "op":
        # Masks and indices ride along with the activations: name only the floating inputs.
        floating = [d for d in ins if is_floating(d)] or list(ins)
        return f"{_dtype_list(floating)} {ARROW} {out}"
    return f"{_dtype_list(ins)} {ARROW} {out}"


_OP_SIGN: Final = {"add": "+", "add_": "+", "sub": "−", "mul": "×", "mul_": "×", "div": "/"}


def casts_text(casts: Sequence[tuple[str, str, str]]) -> str:
    """``casts x, weight, bias: fp32→bf16``, grouping tensors cast the same way.

    >>> casts_text([("x", "float32", "bfloat16"), ("weight", "float32", "bfloat16")])
    'casts x, weight: fp32→bf16'
    """
    groups: dict[tuple[str, str], list[str]] = {}
    for name, src, dst in casts:
        groups.setdefault((src, dst), []).append(name)
    parts = [
        f"{', '.join(names)}: {short_dtype(src)}{ARROW}{short_dtype(dst)}"
        for (src, dst), names in groups.items()
    ]
    return "casts " + "; ".join(parts) if parts else ""


def _node_style(data: dict[str, Any], theme: Theme) -> NodeStyle:
    if data["disagree"] or data["error"]:
        return theme.disagreement
    if data["promotion"]:
        return theme.promotion
    if data["kind"] in ("input", "output"):
        return theme.io
    if data["kind"] == "region":
        return NodeStyle(theme.region_fill, theme.region_border, 1.4, "filled,rounded")
    return theme.policies[POLICY_STYLE_KEY.get(data["policy"], "none")]


def node_label(data: dict[str, Any], theme: Theme, *, compact: bool = False) -> str:
    """The HTML-like label of one box; ``compact`` keeps the name and the dtype line only."""
    if compact:
        return _compact_label(data, theme)
    title = f"<B>{_h(data['title'])}</B>" if data["title"] else ""
    sub = data.get("subtitle") or ""
    if sub:
        title += (NBSP * 2 if title else "") + _font(
            _h(sub), colour=theme.muted, size=SMALL_FONT_SIZE
        )
    rows = [title]
    flow = _h(flow_text(data))
    policy = data["policy"]
    if data["kind"] in ("module", "op") and policy:
        flow += NBSP * 2 + _font(
            f"<I>policy: {_h(CATEGORY_LABEL.get(policy, policy))}</I>",
            colour=theme.muted,
            size=SMALL_FONT_SIZE,
        )
    rows.append(flow)
    if data["casts"]:
        rows.append(_font(_h(casts_text(data["casts"])), colour=theme.muted, size=SMALL_FONT_SIZE))
    if data.get("matmuls"):
        # The backward's 16-bit matmuls (grad_input and grad_weight of a Linear): where the
        # backward's precision is lost or kept.
        counts = ", ".join(f"{op} ×{n}" if n > 1 else op for op, n in data["matmuls"])
        rows.append(
            _font(_h(f"16-bit matmuls: {counts}"), colour=theme.muted, size=SMALL_FONT_SIZE)
        )
    if data["promotion"]:
        widened, to = data["promotion"]
        text = f"promotion to {short_dtype(to)}"
        if data["kind"] == "module":
            # The promoting op is inside the module: say what it mixed.
            text = f"promotion inside: {_dtype_list(widened)} {ARROW} {short_dtype(to)}"
        rows.append(_font(f"<B>{PROMOTION_MARK} {_h(text)}</B>", colour=theme.promotion.border))
    if data.get("differs"):
        # Layers that differ are drawn apart; this line points at the box that makes them differ.
        others = ", ".join(data["differs"])
        rows.append(
            _font(
                f"<B>{DIFFERS_MARK} unlike {_h(others)}</B>",
                colour=theme.text,
                size=SMALL_FONT_SIZE,
            )
        )
    if data["disagree"]:
        rows.append(
            _font(
                f"<B>{DISAGREEMENT_MARK} dispatcher disagrees</B>", colour=theme.disagreement.border
            )
        )
    if data["error"]:
        rows.append(
            _font(
                _h(f"error: {data['error']}"[:80]),
                colour=theme.disagreement.border,
                size=SMALL_FONT_SIZE,
            )
        )
    return _table(rows)


def _compact_label(data: dict[str, Any], theme: Theme) -> str:
    # The overview's cells: the last path component (q_proj, fc1) and the dtype line.
    title = data["title"]
    if data["kind"] == "module":
        title = title.rsplit(".", 1)[-1]
    rows = [f"<B>{_h(title)}</B>", _h(flow_text(data))]
    if data["promotion"]:
        rows[0] = _font(f"<B>{PROMOTION_MARK} {_h(title)}</B>", colour=theme.promotion.border)
    if data["disagree"] or data["error"]:
        rows[0] = _font(f"<B>{DISAGREEMENT_MARK} {_h(title)}</B>", colour=theme.disagreement.border)
    return _table(rows)


def _node_attrs(data: dict[str, Any], theme: Theme, *, compact: bool = False) -> dict[str, str]:
    style = _node_style(data, theme)
    node_style = style.style
    if data["kind"] == "input":
        node_style = "filled,rounded,dashed"
    return {
        "label": node_label(data, theme, compact=compact),
        "shape": "box",
        "style": node_style,
        "fillcolor": style.fill,
        "color": style.border,
        "penwidth": f"{style.penwidth:g}",
        "fontcolor": theme.text,
        "margin": "0.1,0.04",
    }


def _edge_attrs(dtype: str | None, theme: Theme, *, compact: bool = False) -> dict[str, str]:
    style = theme.edges[dtype_family(dtype)]
    attrs = {
        "color": style.colour,
        "penwidth": f"{style.penwidth:g}",
        "style": style.style,
        "arrowsize": "0.7",
    }
    if not compact:
        # The overview's compact boxes spell each dtype out (fp32 → bf16); its edges go unlabelled
        # so that four diagrams fit one page.
        attrs.update(
            label=f" {short_dtype(dtype)} ", fontcolor=theme.muted, fontsize=str(SMALL_FONT_SIZE)
        )
    return attrs


# -- tooltips and descriptions: the full record behind each box, for readers and screen readers --

#: At most this many graph nodes or ops are listed in a tooltip; the rest are counted.
TOOLTIP_LIST_MAX: Final = 6


def _escaped(text: str, *, breaks: bool = True) -> str:
    """Model text as a quoted DOT string: a tooltip; with ``breaks=False`` (control characters
    shown, see :func:`~ampgraph.render.svg.xml_chars`), a node's name, an id, a subgraph's name.

    Backslashes are doubled: in an escString (ids, tooltips) one would start an escape (``\\N``
    is the node name), and a name ending in one (a module may be called ``a\\``) would escape
    the closing quote and leave the file unparsable. The result is a :func:`graphviz.nohtml`
    string, so a name like ``<b>x</b>`` is quoted, not taken for an HTML-like label; graphviz
    escapes the double quotes when it quotes it. An ``&`` is written ``&amp;``: Graphviz reads
    entities in every string (a module called ``&amp;`` would be drawn ``&``).

    >>> print(graphviz.quoting.quote(_escaped('tail\\\\')), graphviz.quoting.quote(_escaped("<b>")))
    "tail\\\\" "<b>"
    """
    return graphviz.escape(xml_chars(text, breaks=breaks).replace("&", "&amp;"))


def _name(text: str) -> str:
    """A node's or a subgraph's name, or an id, as a quoted DOT string: on one line.

    >>> print(graphviz.quoting.quote(_name("a\\nb")))
    "a␊b"
    """
    return _escaped(text, breaks=False)


def _edge(target: graphviz.Digraph, tail: str, head: str, **attrs: str) -> None:
    """An edge from node ``tail`` to node ``head`` (names as given to ``node``), in ``target``.

    Written here, not with ``target.edge``: graphviz reads a ``:`` in an edge's end as a port
    (``node:port``), and a module may be called ``a:b``; the node statements quote the whole name.
    """
    quote = graphviz.quoting.quote
    label = attrs.pop("label", None)  # first, as graphviz's own edge() writes it
    attr = graphviz.quoting.attr_list(label, kwargs=attrs)
    target.body.append(f"\t{quote(_name(tail))} -> {quote(_name(head))}{attr}\n")


def _listing(items: Sequence[str]) -> str:
    shown = ", ".join(items[:TOOLTIP_LIST_MAX])
    more = len(items) - TOOLTIP_LIST_MAX
    return shown + (f" and {more} more" if more > 0 else "")


def _long_name(data: dict[str, Any]) -> str:
    """A box named in full, as a tooltip reader wants it (no names relative to a folded layer)."""
    kind = data["kind"]
    if kind == "module":
        return str(data["path"] or data["title"])
    if kind == "input":
        return f"model input {data['cls']}"
    if kind == "output":
        return "model output"
    where = f" in {data['path']}" if data.get("path") else ""
    if kind == "region":
        return f"autocast region output{where}"
    return f"{data['title']}{where}"


def node_tooltip(graph: nx.MultiDiGraph, node: str) -> str:
    """The full record behind one box, one fact a line: what a browser shows on hover.

    >>> import networkx as nx
    >>> g = nx.MultiDiGraph(check={"compared": 3}, clusters={})
    >>> g.add_node("n", kind="op", title="residual add", path="layers.0", ops=("aten.add.Tensor",),
    ...     members=("add_3",), policy=None, in_dtypes=("float32", "bfloat16"),
    ...     out_dtype="float32", casts=(), promotion=(("float32", "bfloat16"), "float32"),
    ...     disagree=False, error=None, differs=(), chain=(), region_enabled=None)
    >>> print(node_tooltip(g, "n"))
    residual add in layers.0
    op: aten.add.Tensor
    dtypes: float32, bfloat16 → float32
    autocast policy: none (runs in its inputs' dtype)
    type promotion: float32 + bfloat16 → float32
    dispatcher check: agrees
    graph node: add_3
    """
    data = graph.nodes[node]
    kind = data["kind"]
    clusters = graph.graph["clusters"]
    lines = [_long_name(data)]
    if kind == "module":
        lines[0] += f" ({data.get('module_type') or data['cls']})"
    for cid in data["chain"]:
        cluster = clusters[cid]
        if cluster["kind"] == "fold" and cluster["count"] > 1:
            lines.append(
                f"drawn once for {cluster['label']}: {cluster['count']} identical layers "
                f"(names are {cluster['path']}'s)"
            )
        elif cluster["kind"] == "region":
            lines.append(f"inside an autocast region: {cluster['label']}")
    ops = list(data.get("ops") or ())
    if kind in ("module", "op") and ops:
        lines.append(f"op{'s' if len(ops) > 1 else ''}: {_listing(ops)}")
    if kind == "op" and not data.get("path"):
        lines.append("module: (top level)")
    ins = [d or "unknown" for d in data["in_dtypes"]]
    out = data["out_dtype"] or "unknown"
    if kind == "input":
        lines.append(f"dtype: {out}")
    elif kind == "output":
        lines.append(f"dtypes: {', '.join(ins) or '-'}")
    elif kind == "region":
        lines.append(f"dtype: {out}")
    else:
        lines.append(f"dtypes: {', '.join(ins) or '-'} {ARROW} {out}")
    if kind in ("module", "op"):
        policy = data["policy"]
        label = CATEGORY_LABEL.get(policy, policy) if policy else None
        lines.append(
            "autocast policy: none (runs in its inputs' dtype)"
            if not policy
            else f"autocast policy: {label}" + (f" ({policy})" if label != policy else "")
        )
        if data["casts"]:
            casts = [f"{n} {src}{ARROW}{dst}" for n, src, dst in data["casts"]]
            # In the backward most casts are autograd's (gradients cast to their input's dtype).
            whose = "casts" if graph.graph.get("pass") == "backward" else "autocast casts"
            lines.append(f"{whose}: {_listing(casts)}")
    if data["promotion"]:
        widened, to = data["promotion"]
        lines.append(f"type promotion: {' + '.join(d or 'unknown' for d in widened)} {ARROW} {to}")
    if data.get("differs"):
        lines.append(f"differs from {', '.join(data['differs'])}")
    if data["error"]:
        lines.append(f"error: {data['error']}")
    if graph.graph.get("check") and kind in ("module", "op"):
        lines.append("dispatcher check: " + ("disagrees" if data["disagree"] else "agrees"))
    members = list(data.get("members") or ())
    if kind in ("module", "op", "region") and members:
        lines.append(f"graph node{'s' if len(members) > 1 else ''}: {_listing(members)}")
    return "\n".join(lines)


def edge_tooltip(graph: nx.MultiDiGraph, u: str, v: str, dtype: str | None) -> str:
    """What one edge carries, between which boxes (named in full).

    >>> import networkx as nx
    >>> g = nx.MultiDiGraph()
    >>> g.add_node("a", kind="module", path="layers.0.fc1", title="fc1")
    >>> g.add_node("b", kind="module", path="layers.0.fc2", title="fc2")
    >>> print(edge_tooltip(g, "a", "b", "bfloat16"))
    layers.0.fc1 → layers.0.fc2
    carries bfloat16
    """
    a, b = graph.nodes[u], graph.nodes[v]
    return f"{_long_name(a)} {ARROW} {_long_name(b)}\ncarries {dtype or 'an unknown dtype'}"


def cluster_tooltip(cluster: dict[str, Any]) -> str:
    """A frame's caption explained: folded layers, or an autocast region."""
    if cluster["kind"] == "region":
        return (
            f"{cluster['label']} in {cluster['path'] or 'the model'}: the ops in this frame run so"
        )
    if cluster["count"] > 1:
        return (
            f"{cluster['label']}: {cluster['count']} identical layers drawn once; "
            f"boxes inside name {cluster['path']}'s modules"
        )
    return f"{cluster['label']}: a layer that differs from its neighbours"


def describe(graph: nx.MultiDiGraph) -> str:
    """A sentence or two for screen readers: what the diagram shows, in numbers.

    It becomes the SVG's ``<desc>`` (its ``<title>`` is :func:`title_text`).
    """
    setting = graph.graph["setting"]
    counts = graph.graph["counts"]
    boxes = sum(1 for _, d in graph.nodes(data=True) if d["kind"] in ("module", "op", "region"))
    view = "one box per module call" if graph.graph["view"] == "modules" else "one box per op"
    parts = [
        (
            f"Dtype flow of {graph.graph['model']} in the setting {setting.get('name', '')}, "
            f"{view}: {boxes} boxes, edges coloured and labelled by dtype"
        )
    ]
    folded = [c for c in graph.graph["clusters"].values() if c["kind"] == "fold" and c["count"] > 1]
    for cluster in folded:
        parts.append(f"{cluster['label']} are {cluster['count']} identical layers drawn once")
    parts.append(
        f"{counts['casts']} autocast casts and {counts['promotions']} type promotions in all"
    )
    check = graph.graph.get("check")
    if check:
        bad = check.get("disagreements", 0)
        parts.append(
            f"checked against the dispatcher: {check.get('compared', 0)} ops, "
            + ("all agree" if not bad else f"{bad} disagree")
        )
    return "; ".join(parts) + ". Each box and edge has a tooltip with its full record."


def title_text(graph: nx.MultiDiGraph) -> str:
    """``MODEL — setting name: setting title``."""
    setting = graph.graph["setting"]
    try:
        caption = Setting.from_dict(setting).title
    except Exception:  # noqa: BLE001 - a hand-made report may carry an odd setting: show its name
        caption = ""
    name = setting.get("name", "")
    if graph.graph.get("pass") == "backward":
        name = f"{name} backward" if name else "backward"
    return (
        f"{graph.graph['model']} — {name}: {caption}"
        if caption
        else f"{graph.graph['model']} — {name}"
    )


def subtitle_text(graph: nx.MultiDiGraph) -> str:
    """What the view shows, and what proved it."""
    parts = ["module view" if graph.graph["view"] == "modules" else "op view (every ATen node)"]
    if graph.graph.get("pass") == "backward":
        parts.insert(0, "gradients from the loss to the parameters")
    folded = [c for c in graph.graph["clusters"].values() if c["kind"] == "fold" and c["count"] > 1]
    if folded:
        parts.append("identical layers drawn once")
    check = graph.graph.get("check")
    if check:
        bad = check.get("disagreements", 0)
        compared = check.get("compared", 0)
        parts.append(
            f"checked against the dispatcher: {compared} ops, "
            + ("all agree" if not bad else f"{bad} disagree")
        )
    return " · ".join(parts)


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
            f'<TD ALIGN="LEFT">{_h(FAMILY_LABEL[family] + dash)}</TD></TR>'
        )
    box_rows = ['<TR><TD COLSPAN="2" ALIGN="LEFT"><B>boxes: autocast policy</B></TD></TR>']
    for key in POLICY_ORDER:
        label = CATEGORY_LABEL.get(key, key)
        if key == "none":
            label = "none (runs in its inputs' dtype)"
        box_rows.append(_swatch_row(theme.policies[key], _h(label)))
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


def _cluster_attrs(cluster: dict[str, Any], theme: Theme) -> dict[str, str]:
    # No cluster label: dot routes edges through a cluster's label, so the frame's caption is a
    # node instead (see _Emitter._caption), which edges go around.
    common = {"label": "", "margin": CLUSTER_MARGIN, "style": "filled,rounded"}
    if cluster["kind"] == "region":
        return {
            **common,
            "style": "filled,rounded,dashed",
            "fillcolor": theme.region_fill,
            "color": theme.region_border,
            "penwidth": "1.6",
        }
    return {
        **common,
        "fillcolor": theme.fold_fill,
        "color": theme.fold_border,
        "penwidth": "2.4" if cluster["count"] > 1 else "1",
    }


def cluster_caption(cluster: dict[str, Any], theme: Theme) -> str:
    """The caption of a frame: ``model.decoder.layers.0–11 ×12`` or ``autocast disabled``."""
    if cluster["kind"] == "region":
        return "<" + _font(f"<B>{_h(cluster['label'])}</B>", colour=theme.region_border) + ">"
    text = f"<B>{_h(cluster['label'])}</B>"
    count = cluster["count"]
    if count > 1:
        text += NBSP * 2 + _font(f"<B>{FOLD_MARK}{count}</B>", size=17)
        text += "<BR/>" + _font(
            "identical layers, drawn once", colour=theme.muted, size=SMALL_FONT_SIZE
        )
    return f"<{text}>"


def _cluster_tree(graph: nx.MultiDiGraph) -> dict[tuple[str, ...], list[str]]:
    """Cluster chain -> the nodes drawn directly in it, in execution order."""
    tree: dict[tuple[str, ...], list[str]] = {}
    for node in sorted(graph.nodes, key=lambda n: graph.nodes[n]["order"]):
        tree.setdefault(graph.nodes[node]["chain"], []).append(node)
    return tree


@dataclass
class _Emitter:
    """Writes one diagram graph into a Graphviz (sub)graph, ids prefixed for the overview."""

    graph: nx.MultiDiGraph
    theme: Theme
    prefix: str = ""
    compact: bool = False

    def node_id(self, node: str) -> str:
        """The box's DOT name and SVG element id: stable, from module paths (see
        :func:`~ampgraph.render.graph.element_id`)."""
        return f"{self.prefix}{self.graph.nodes[node]['id']}"

    def cluster_id(self, cid: str) -> str:
        return f"{self.prefix}{self.graph.graph['clusters'][cid]['id']}"

    def emit(self, target: graphviz.Digraph) -> None:
        tree = _cluster_tree(self.graph)
        self._emit_chain(target, (), tree)
        order = {n: self.graph.nodes[n]["order"] for n in self.graph.nodes}
        edges = sorted(self.graph.edges(keys=True), key=lambda e: (order[e[1]], order[e[0]], e[2]))
        for u, v, key in edges:
            dtype = self.graph.edges[u, v, key]["dtype"]
            src, dst = self.node_id(u), self.node_id(v)
            _edge(
                target,
                src,
                dst,
                id=_name(f"{src}->{dst}[{dtype or 'unknown'}]"),
                tooltip=_escaped(edge_tooltip(self.graph, u, v, dtype)),
                **_edge_attrs(dtype, self.theme, compact=self.compact),
            )

    def _emit_chain(
        self,
        target: graphviz.Digraph,
        chain: tuple[str, ...],
        tree: dict[tuple[str, ...], list[str]],
    ) -> None:
        for node in tree.get(chain, []):
            name = self.node_id(node)
            target.node(
                _name(name),
                id=_name(name),
                tooltip=_escaped(node_tooltip(self.graph, node)),
                **_node_attrs(self.graph.nodes[node], self.theme, compact=self.compact),
            )
        depth = len(chain)
        first_order: dict[tuple[str, ...], int] = {}
        for key, nodes in tree.items():
            if len(key) > depth and key[:depth] == chain:
                child = key[: depth + 1]
                low = min(self.graph.nodes[n]["order"] for n in nodes)
                first_order[child] = min(first_order.get(child, low), low)
        for child in sorted(first_order, key=lambda c: (first_order[c], c)):
            cid = child[-1]
            with target.subgraph(name=_name(f"cluster_{self.cluster_id(cid)}")) as sub:
                sub.attr(
                    id=_name(self.cluster_id(cid)),
                    **_cluster_attrs(self.graph.graph["clusters"][cid], self.theme),
                )
                self._caption(sub, cid, child, tree)
                self._emit_chain(sub, child, tree)

    def _caption(
        self,
        target: graphviz.Digraph,
        cid: str,
        chain: tuple[str, ...],
        tree: dict[tuple[str, ...], list[str]],
    ) -> None:
        """A frame's caption as a plain node on the rank of the frame's first box.

        Being a node, the caption takes room in its rank and edges are routed around it; a
        Graphviz cluster label is not, and edges entering the frame cross it.
        """
        inside = [n for key, ns in tree.items() if key[: len(chain)] == chain for n in ns]
        first = min(inside, key=lambda n: self.graph.nodes[n]["order"])
        cluster = self.graph.graph["clusters"][cid]
        caption = f"{self.cluster_id(cid)}/caption"
        target.node(
            _name(caption),
            id=_name(caption),
            label=cluster_caption(cluster, self.theme),
            tooltip=_escaped(cluster_tooltip(cluster)),
            shape="plain",
            fontcolor=self.theme.text,
            fontsize="13",
        )
        with target.subgraph() as same:
            same.attr(rank="same")
            same.node(_name(caption))
            same.node(_name(self.node_id(first)))

    def inputs_on_top(self, target: graphviz.Digraph) -> None:
        """Model inputs on the first rank, as in the seed's drawings, however deep they are read
        (otherwise dot may place an attention mask inside a layer's frame)."""
        inputs = [
            n for n in sorted(self.graph.nodes, key=lambda n: self.graph.nodes[n]["order"])
            if self.graph.nodes[n]["kind"] == "input" and not self.graph.nodes[n]["chain"]
        ]  # fmt: skip
        if inputs:
            with target.subgraph(name=_name(f"{self.prefix}inputs")) as top:
                top.attr(rank="min")
                for node in inputs:
                    top.node(_name(self.node_id(node)))

    def first(self) -> str | None:
        nodes = sorted(self.graph.nodes, key=lambda n: self.graph.nodes[n]["order"])
        return self.node_id(nodes[0]) if nodes else None

    def last(self) -> str | None:
        nodes = sorted(self.graph.nodes, key=lambda n: self.graph.nodes[n]["order"])
        return self.node_id(nodes[-1]) if nodes else None


def _new_digraph(name: str, title: str, subtitle: str, theme: Theme) -> graphviz.Digraph:
    dot = graphviz.Digraph(_name(name))  # the model's name: a class's, or the spec
    label = (
        f"<<B>{_h(title)}</B><BR/>"
        + _font(_h(subtitle), colour=theme.muted, size=FONT_SIZE)
        + '<BR/><FONT POINT-SIZE="6"> </FONT>>'  # a little air between the title and the boxes
    )
    dot.attr(
        "graph",
        **GRAPH_ATTRS,
        label=label,
        fontname=FONT,
        fontsize=str(TITLE_FONT_SIZE),
        fontcolor=theme.text,
        bgcolor=theme.background,
    )
    dot.attr("node", fontname=FONT, fontsize=str(FONT_SIZE))
    dot.attr("edge", fontname=FONT)
    return dot


def _add_legend(
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
            legend.node(_name(beside[0]))
    for node in beside:
        _edge(dot, node, "legend", style="invis")


class Diagram(NamedTuple):
    """A diagram's Graphviz source with the title and description screen readers are given
    (:func:`ampgraph.render.svg.accessible` writes them into the SVG)."""

    source: str
    title: str
    description: str


def graph_to_dot(graph: nx.MultiDiGraph, *, theme: str = "light", name: str = "ampgraph") -> str:
    """Graphviz source for a diagram graph built by :func:`~ampgraph.render.graph.build_graph`."""
    th = THEMES[theme]
    dot = _new_digraph(name, title_text(graph), subtitle_text(graph), th)
    emitter = _Emitter(graph, th)
    emitter.emit(dot)
    emitter.inputs_on_top(dot)
    last = emitter.last()
    _add_legend(dot, LegendFacts.of([graph]), th, [last] if last else [])
    if graph.graph.get("memory"):
        _add_memory_panel(dot, graph.graph["memory"], th)
    return dot.source


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
    head = "".join(f"<TD><B>{_h(short_dtype(d))}</B></TD>" for d in dtypes)
    cells = [
        f'<TR><TD COLSPAN="{len(dtypes) + 1}"><B>saved for backward</B></TD></TR>',
        f'<TR><TD ALIGN="LEFT"><B>layer</B></TD>{head}</TR>',
    ]
    for name, row, count, last in merged:
        # "layers.0–11, each": the range of identical layers, and that the bytes are per layer.
        label = name if count == 1 else f"{name}–{last.rpartition('.')[2]}, each"
        values = "".join(
            f'<TD ALIGN="RIGHT">{_h(human_bytes(row[d])) if d in row else "–"}</TD>' for d in dtypes
        )
        cells.append(f'<TR><TD ALIGN="LEFT">{_h(label)}</TD>{values}</TR>')
    totals = {d: sum(r.get(d, 0) for _, r in rows) for d in dtypes}
    values = "".join(f'<TD ALIGN="RIGHT"><B>{_h(human_bytes(totals[d]))}</B></TD>' for d in dtypes)
    cells.append(f'<TR><TD ALIGN="LEFT"><B>total</B></TD>{values}</TR>')
    return (
        f'<<TABLE BORDER="1" CELLBORDER="0" CELLSPACING="0" CELLPADDING="3" '
        f'COLOR="{theme.muted}">{"".join(cells)}</TABLE>>'
    )


def _same_list(first: str, name: str) -> bool:
    """Whether two layer names are items of one list (``layers.0``, ``layers.1``)."""
    return first.rpartition(".")[0] == name.rpartition(".")[0] and name.rpartition(".")[2].isdigit()


def _add_memory_panel(
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


def diagram(
    report: Report,
    *,
    view: str = "modules",
    fold: bool = True,
    theme: str = "light",
    pass_: str = "forward",
) -> Diagram:
    """:func:`to_dot`'s source with the diagram's title and description.

    >>> from ampgraph.report.records import Report
    >>> report = Report.from_json(open("tests/data/opt-125m-amp-fp32.json").read())
    >>> diagram(report).title
    'opt-125m — amp-fp32: autocast cuda bf16, parameters fp32'
    """
    _check_theme(theme)
    graph = build_graph(report, view=view, fold=fold, pass_=pass_)
    return Diagram(
        graph_to_dot(graph, theme=theme, name=report.model), title_text(graph), describe(graph)
    )


def to_dot(
    report: Report,
    *,
    view: str = "modules",
    fold: bool = True,
    theme: str = "light",
    pass_: str = "forward",
) -> str:
    """Graphviz source of a report's dtype-flow diagram; needs no Graphviz installation.

    ``view`` is ``"modules"`` (one box per leaf-module call and per free op that matters) or
    ``"ops"`` (every ATen node); ``fold`` draws identical repeated layers once, marked ``×N``;
    ``theme`` is ``"light"`` or ``"dark"``. Every box and edge carries a ``tooltip`` with its full
    record and an ``id`` made from module paths (``module/model.decoder.layers.0.fc1``), so the
    same box keeps its id when the model around it changes.

    >>> import torch
    >>> from ampgraph import analyze
    >>> report = analyze(torch.nn.Linear(4, 4), "amp-fp32", args=(torch.randn(2, 4),))
    >>> print(to_dot(report).splitlines()[0])
    digraph Linear {
    """
    return diagram(report, view=view, fold=fold, theme=theme, pass_=pass_).source


def _check_theme(theme: str) -> None:
    if theme not in THEMES:
        raise RenderError(f"unknown theme {theme!r}: use one of {', '.join(THEMES)}")


# -- the overview ----------------------------------------------------------------------------------

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
    facts_html = _font(_h(facts), colour=theme.muted, size=FONT_SIZE)
    if promotions:
        facts_html = _font(
            _h(f"autocast casts: {counts['casts']} · ")
            + f"<B>{PROMOTION_MARK} promotions: {promotions}</B>",
            colour=theme.promotion.border,
            size=FONT_SIZE,
        )
    caption = title_text(graph).split(" — ", 1)[-1]
    return f"<<B>{_h(caption)}</B><BR/>{facts_html}>"


def _cell_prefixes(reports: Sequence[Report]) -> list[str]:
    """Id prefixes of the overview's cells: the setting's name (``amp-fp32/``), with the model
    where several models share a name, so ids stay unique and readable."""
    names = [str(r.setting.get("name", "")) for r in reports]
    if len(set(names)) < len(names):
        names = [f"{r.model}/{n}" for r, n in zip(reports, names)]
    if len(set(names)) < len(names):
        names = [f"{n}.{i}" for i, n in enumerate(names)]
    return [f"{n}/" for n in names]


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
    _check_theme(theme)
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
    dot = _new_digraph("overview", title, subtitle, th)
    emitters: list[list[_Emitter]] = []
    graphs = []
    for r_i, row in enumerate(grid):
        emitters.append([])
        for c_i, report in enumerate(row):
            graph = build_graph(report, view=view, fold=fold)
            graphs.append(graph)
            prefix = prefixes[id(report)]
            emitter = _Emitter(graph, th, prefix=prefix, compact=True)
            emitters[-1].append(emitter)
            with dot.subgraph(name=_name(f"cluster_{prefix}cell")) as cell:
                cell.attr(
                    id=_name(f"{prefix}cell"),
                    label=_cell_label(graph, th),
                    tooltip=_escaped(describe(graph)),
                    labeljust="c",
                    fontsize="14",
                    fontcolor=th.text,
                    style="rounded",
                    color=th.muted,
                    penwidth="1.2",
                    margin="16",
                )
                emitter.emit(cell)
    # Align the rows: each row's cells start on the same rank.
    for r_i, row_emitters in enumerate(emitters):
        firsts = [e.first() for e in row_emitters if e.first()]
        if len(firsts) > 1:
            with dot.subgraph(name=f"row_{r_i}") as same:
                same.attr(rank="same")
                for node in firsts:
                    same.node(_name(str(node)))
    # Stack the rows: an invisible edge from each cell's last box to the first box of the cell
    # below puts the two in one column (dot lays unconnected columns side by side, in order).
    for r_i in range(1, len(emitters)):
        for c_i, below in enumerate(emitters[r_i]):
            above = emitters[r_i - 1][c_i] if c_i < len(emitters[r_i - 1]) else None
            if above is not None and above.last() and below.first():
                _edge(dot, str(above.last()), str(below.first()), style="invis", weight="0")
    bottom = [e.last() for e in emitters[-1] if e.last()]
    _add_legend(dot, LegendFacts.of(graphs), th, [str(b) for b in bottom], same_rank=False)
    description = " ".join(
        f"Cell {prefixes[id(r)].rstrip('/')}: {describe(g)}"
        for r, g in zip([r for row in grid for r in row], graphs)
    )
    return Diagram(dot.source, title, description)
