"""Box and edge labels as Graphviz HTML-like text, and model text escaped for DOT.

A box's label is an HTML-like table (title, dtype line, policy, casts, highlights); names that
come from the model (a module may be called ``a:b``, ``<b>`` or ``a\\``) are escaped here, once,
for the two places DOT reads them: HTML-like labels (:func:`html_text`) and quoted strings
(:func:`dot_string`, :func:`dot_name`).

This module is torch-free.

>>> flow_text({"kind": "op", "op": "mul", "in_dtypes": ("bfloat16", "bfloat16"),
...            "out_dtype": "bfloat16", "promotion": None})
'bf16 × bf16 → bf16'
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from typing import Any, Final

import graphviz

from ampgraph.policy import CATEGORY_LABEL
from ampgraph.render.style import (
    DIFFERS_MARK,
    DISAGREEMENT_MARK,
    POLICY_STYLE_KEY,
    PROMOTION_MARK,
    SMALL_FONT_SIZE,
    NodeStyle,
    Theme,
    dtype_family,
    is_floating,
)
from ampgraph.render.svg import xml_chars
from ampgraph.settings import short_dtype

ARROW: Final = "→"


#: SVG collapses runs of spaces; labels that need room between words use no-break spaces.
NBSP: Final = "&#160;"


def html_text(text: str) -> str:
    """Escape text for an HTML-like label (Graphviz parses it as XML: a control character in a
    module's name would make it refuse the label)."""
    return escape(xml_chars(text, breaks=False), quote=True)


def font(text: str, *, colour: str | None = None, size: int | None = None) -> str:
    """``text`` in a ``<FONT>`` of that colour and size (none when neither is given).

    >>> font("x", size=9)
    '<FONT POINT-SIZE="9">x</FONT>'
    """
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
    title = f"<B>{html_text(data['title'])}</B>" if data["title"] else ""
    sub = data.get("subtitle") or ""
    if sub:
        title += (NBSP * 2 if title else "") + font(
            html_text(sub), colour=theme.muted, size=SMALL_FONT_SIZE
        )
    rows = [title]
    flow = html_text(flow_text(data))
    policy = data["policy"]
    if data["kind"] in ("module", "op") and policy:
        flow += NBSP * 2 + font(
            f"<I>policy: {html_text(CATEGORY_LABEL.get(policy, policy))}</I>",
            colour=theme.muted,
            size=SMALL_FONT_SIZE,
        )
    rows.append(flow)
    if data["casts"]:
        rows.append(
            font(html_text(casts_text(data["casts"])), colour=theme.muted, size=SMALL_FONT_SIZE)
        )
    if data.get("matmuls"):
        # The backward's 16-bit matmuls (grad_input and grad_weight of a Linear): where the
        # backward's precision is lost or kept.
        counts = ", ".join(f"{op} ×{n}" if n > 1 else op for op, n in data["matmuls"])
        rows.append(
            font(html_text(f"16-bit matmuls: {counts}"), colour=theme.muted, size=SMALL_FONT_SIZE)
        )
    if data["promotion"]:
        widened, to = data["promotion"]
        text = f"promotion to {short_dtype(to)}"
        if data["kind"] == "module":
            # The promoting op is inside the module: say what it mixed.
            text = f"promotion inside: {_dtype_list(widened)} {ARROW} {short_dtype(to)}"
        rows.append(
            font(f"<B>{PROMOTION_MARK} {html_text(text)}</B>", colour=theme.promotion.border)
        )
    if data.get("differs"):
        # Layers that differ are drawn apart; this line points at the box that makes them differ.
        others = ", ".join(data["differs"])
        rows.append(
            font(
                f"<B>{DIFFERS_MARK} unlike {html_text(others)}</B>",
                colour=theme.text,
                size=SMALL_FONT_SIZE,
            )
        )
    if data["disagree"]:
        rows.append(
            font(
                f"<B>{DISAGREEMENT_MARK} dispatcher disagrees</B>", colour=theme.disagreement.border
            )
        )
    if data["error"]:
        rows.append(
            font(
                html_text(f"error: {data['error']}"[:80]),
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
    rows = [f"<B>{html_text(title)}</B>", html_text(flow_text(data))]
    if data["promotion"]:
        rows[0] = font(f"<B>{PROMOTION_MARK} {html_text(title)}</B>", colour=theme.promotion.border)
    if data["disagree"] or data["error"]:
        rows[0] = font(
            f"<B>{DISAGREEMENT_MARK} {html_text(title)}</B>", colour=theme.disagreement.border
        )
    return _table(rows)


def node_attrs(data: dict[str, Any], theme: Theme, *, compact: bool = False) -> dict[str, str]:
    """A box's Graphviz attributes: label, shape, fill and border from its policy and marks."""
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


def edge_attrs(dtype: str | None, theme: Theme, *, compact: bool = False) -> dict[str, str]:
    """An edge's Graphviz attributes: colour and line style by dtype family, a dtype label."""
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


def dot_string(text: str, *, breaks: bool = True) -> str:
    """Model text as a quoted DOT string: a tooltip; with ``breaks=False`` (control characters
    shown, see :func:`~ampgraph.render.svg.xml_chars`), a node's name, an id, a subgraph's name.

    Backslashes are doubled: in an escString (ids, tooltips) one would start an escape (``\\N``
    is the node name), and a name ending in one (a module may be called ``a\\``) would escape
    the closing quote and leave the file unparsable. The result is a :func:`graphviz.nohtml`
    string, so a name like ``<b>x</b>`` is quoted, not taken for an HTML-like label; graphviz
    escapes the double quotes when it quotes it. An ``&`` is written ``&amp;``: Graphviz reads
    entities in every string (a module called ``&amp;`` would be drawn ``&``).

    >>> print(graphviz.quoting.quote(dot_string('tail\\\\')), graphviz.quoting.quote(dot_string("<b>")))
    "tail\\\\" "<b>"
    """
    return graphviz.escape(xml_chars(text, breaks=breaks).replace("&", "&amp;"))


def dot_name(text: str) -> str:
    """A node's or a subgraph's name, or an id, as a quoted DOT string: on one line.

    >>> print(graphviz.quoting.quote(dot_name("a\\nb")))
    "a␊b"
    """
    return dot_string(text, breaks=False)


def write_edge(target: graphviz.Digraph, tail: str, head: str, **attrs: str) -> None:
    """An edge from node ``tail`` to node ``head`` (names as given to ``node``), in ``target``.

    Written here, not with ``target.edge``: graphviz reads a ``:`` in an edge's end as a port
    (``node:port``), and a module may be called ``a:b``; the node statements quote the whole name.
    """
    quote = graphviz.quoting.quote
    label = attrs.pop("label", None)  # first, as graphviz's own edge() writes it
    attr = graphviz.quoting.attr_list(label, kwargs=attrs)
    target.body.append(f"\t{quote(dot_name(tail))} -> {quote(dot_name(head))}{attr}\n")
