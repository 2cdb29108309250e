"""Tooltips, titles and descriptions: the full record behind each box, for readers and screen
readers.

A box's tooltip names it in full (no names relative to a folded layer) and lists one fact a
line; :func:`describe` and :func:`title_text` become the SVG's ``<desc>`` and ``<title>``.

This module is torch-free.

>>> cluster_tooltip({"kind": "fold", "label": "layers.0–11", "count": 12, "path": "layers.0"})
"layers.0–11: 12 identical layers drawn once; boxes inside name layers.0's modules"
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import networkx as nx

from ampgraph.policy import CATEGORY_LABEL
from ampgraph.render.labels import ARROW
from ampgraph.settings import Setting

#: At most this many graph nodes or ops are listed in a tooltip; the rest are counted.
TOOLTIP_LIST_MAX: Final = 6


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
    if graph.graph.get("stand_in"):  # the full reason is in the report's capture.stand_in
        device = graph.graph["setting"].get("device_type", "?")
        parts.insert(0, f"a prediction for {device} from its autocast lists, not checked on it")
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
