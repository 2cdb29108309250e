"""From a :class:`~ampgraph.report.records.Report` to the graph a diagram draws (a networkx graph).

Two views:

* ``modules``: one box per leaf-module call, plus the free ops that matter to a reader of the
  dtype flow (adds and multiplies of two activations, attention and softmax, matmuls, explicit
  casts that change the dtype, ops with an autocast policy, promotions, autocast regions). Every
  other op (views, reshapes, transposes, dropout, mask arithmetic) is collapsed: edges pass
  through it, carrying the dtype its consumer receives.
* ``ops``: every ATen node.

What a box holds is :mod:`ampgraph.render.boxes`'s; repeated layers are folded by
:mod:`ampgraph.render.folded_layers`; the backward pass is read through :mod:`ampgraph.render.backward_diagram`.

The result is a :class:`networkx.MultiDiGraph` (edges keyed by dtype) whose node attributes are
plain data (see :func:`build_graph`); :mod:`ampgraph.render.dot` turns it into Graphviz source.

This module is torch-free.

>>> from ampgraph import analyze, load_model
>>> g = build_graph(analyze(load_model("llama-tiny"), "amp-fp32", check=False))
>>> g.graph["clusters"]["fold/model.layers.0"]["count"]       # its two decoder layers, drawn once
2
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import networkx as nx

from ampgraph.errors import RenderError
from ampgraph.render.backward_diagram import (
    backward_report,
    backward_titles,
    mark_backward,
    memory_rows,
)
from ampgraph.render.boxes import (
    Context,
    draws_free_op,
    io_attrs,
    module_attrs,
    node_id,
    op_attrs,
    region_attrs,
    region_body,
    region_sinks,
    relative_path,
)
from ampgraph.render.folded_layers import fold_layers

if TYPE_CHECKING:  # only for annotations: records are plain data the renderer reads, never builds
    from ampgraph.report.records import NodeRecord, Report


VIEWS: Final = ("modules", "ops")


#: Which pass of a training step a diagram draws (``train`` draws both, as two diagrams).
PASSES: Final = ("forward", "backward")


def build_graph(
    report: Report, *, view: str = "modules", fold: bool = True, pass_: str = "forward"
) -> nx.MultiDiGraph:
    """The diagram's graph: nodes with plain-data attributes, edges keyed by the dtype they carry.

    Node attributes: ``kind`` (input, output, module, op, region), ``id`` (stable, from module
    paths: see :func:`element_id`), ``title`` and ``subtitle`` (names relative to the folded
    layer), ``path`` (the full module path), ``cls``, ``ops`` (the ATen ops the box stands for),
    ``members`` (their graph nodes), ``policy``, ``in_dtypes``, ``out_dtype``, ``casts``
    ((name, from, to) triples), ``promotion`` ((input dtypes, result) or None), ``residual``,
    ``disagree``, ``error``, ``chain`` (cluster ids, outermost first) and ``order``.
    Graph attributes: ``model``, ``setting``, ``view``, ``fold``, ``check``, ``counts`` and
    ``clusters`` (id -> ``{kind, id, label, count, path}``).

    >>> import torch
    >>> from ampgraph import analyze
    >>> report = analyze(torch.nn.Linear(4, 4), "amp-fp32", args=(torch.randn(2, 4),))
    >>> g = build_graph(report)
    >>> [(n, g.nodes[n]["kind"]) for n in g]                  # the Linear is one module box
    [('module/', 'module'), ('input/input', 'input'), ('output/output', 'output')]
    >>> [cast[0] for cast in g.nodes["module/"]["casts"]]    # the casts autocast makes in it
    ['x', 'weight', 'bias']
    """
    if view not in VIEWS:
        raise RenderError(f"unknown view {view!r}: use one of {', '.join(VIEWS)}")
    if pass_ not in PASSES:
        raise RenderError(f"unknown pass {pass_!r}: use one of {', '.join(PASSES)}")
    source = report
    if pass_ == "backward":
        report = backward_report(report)
    ctx = Context.of(report)
    graph = nx.MultiDiGraph(
        model=report.model,
        setting=dict(report.setting),
        view=view,
        fold=fold,
        check=report.check,
        # xpu or mps on a torch without them: the diagram says it is a prediction (issue 35).
        stand_in=(report.capture or {}).get("stand_in"),
        clusters={},
        counts={
            "ops": sum(1 for r in report.nodes if r.kind == "op"),
            "casts": sum(len(r.casts) for r in report.nodes),
            "promotions": sum(1 for r in report.nodes if r.promotion),
        },
    )
    graph.graph["pass"] = pass_
    owner = _place_nodes(ctx, graph, view)
    if pass_ == "backward":
        mark_backward(ctx, graph)
    _connect(ctx, graph, owner)
    _drop_unused_inputs(graph)
    _mark_residuals(graph)
    fold_layers(graph, fold)
    _add_region_clusters(ctx, graph)
    _finish_titles(graph)
    if pass_ == "backward":
        backward_titles(graph)
        graph.graph["memory"] = memory_rows(source)
    _assign_ids(graph)
    return graph


def _place_nodes(ctx: Context, graph: nx.MultiDiGraph, view: str) -> dict[str, str]:
    """Add the drawn nodes; return record name -> the graph node that stands for it."""
    report = ctx.report
    owner: dict[str, str] = {}
    order = {rec.name: k for k, rec in enumerate(report.nodes)}
    if view == "modules":
        for call in report.modules:
            members = [n for n in call.nodes if n in ctx.records]
            if not members:
                continue
            # torch.export names a call "L__self__<path>[@n]"; the prefix says nothing to a reader.
            node = node_id("module", call.call.removeprefix("L__self__") or call.path)
            graph.add_node(node, **module_attrs(ctx, call, min(order[n] for n in members)))
            for name in members:
                owner[name] = node
    body = region_body(report)
    for rec in report.nodes:
        if rec.name in owner or rec.is_source:
            continue
        k = order[rec.name]
        if rec.kind in ("input", "output"):
            node = node_id(rec.kind, rec.name)
            graph.add_node(node, **io_attrs(rec, k))
        elif rec.kind == "region":
            node = node_id("region", rec.name)
            inside = body.get(rec.name, [])
            holders = {owner.get(r.name) for r in inside}
            if view == "modules" and len(holders) == 1 and None not in holders:
                # The whole region runs inside one module call (seed 002's fp32 wrapper, Llama's
                # rotary embedding): that box stands for it, drawn inside the region's frame. A
                # separate region box would sit in the middle of the call, a loop in the drawing.
                owner[rec.name] = holders.pop()  # type: ignore[assignment]
                continue
            # The region node stands for the value leaving the region: order it after its body.
            last = max((order[r.name] for r in inside), default=k)
            graph.add_node(node, **region_attrs(ctx, rec, inside, last + 0.5 if inside else k))
        elif view == "ops" or draws_free_op(ctx, rec):
            node = node_id("op", rec.name)
            graph.add_node(node, **op_attrs(ctx, rec, k))
        else:
            continue
        owner[rec.name] = node
    return owner


def _connect(ctx: Context, graph: nx.MultiDiGraph, owner: dict[str, str]) -> None:
    """Edges between drawn nodes; collapsed records pass their upstream drawn nodes through."""
    body = region_body(ctx.report)
    # Records are in execution order, so one pass computes, for every collapsed record, the drawn
    # nodes its value comes from (producers always precede consumers).
    upstream: dict[str, frozenset[str]] = {}

    def sources(name: str) -> frozenset[str]:
        if name in owner:
            return frozenset({owner[name]})
        return upstream.get(name, frozenset())

    def inputs_of(rec: NodeRecord) -> list[tuple[str, str | None]]:
        if rec.kind == "region" and body.get(rec.name):
            # The region's value is what its body's last ops produce, not its operands.
            return [(s.name, s.out_dtype) for s in region_sinks(body[rec.name])]
        return [(i["node"], i["dtype"]) for i in rec.inputs]

    for rec in ctx.report.nodes:
        if rec.is_source:
            continue
        node = owner.get(rec.name)
        if node is None:
            upstream[rec.name] = frozenset().union(*(sources(n) for n, _ in inputs_of(rec)))
            continue
        members = set(graph.nodes[node]["members"])
        for name, dtype in inputs_of(rec):
            if name in members or ctx.is_source(name):
                continue
            for src in sorted(sources(name), key=lambda n: graph.nodes[n]["order"]):
                if src != node:
                    graph.add_edge(src, node, key=dtype or "", dtype=dtype)


def _drop_unused_inputs(graph: nx.MultiDiGraph) -> None:
    # Inputs nothing reads (OPT's use_cache flag) would float loose in the diagram.
    unused = [
        n for n, d in graph.nodes(data=True) if d["kind"] == "input" and not graph.out_degree(n)
    ]
    graph.remove_nodes_from(unused)


def _mark_residuals(graph: nx.MultiDiGraph) -> None:
    """An add whose one operand also feeds the path to its other operand is a residual add."""
    for node, data in graph.nodes(data=True):
        if data["kind"] != "op" or data["op"] not in ("add", "add_"):
            continue
        preds = sorted({u for u, _ in graph.in_edges(node)})
        if len(preds) != 2:
            continue
        for skip, main in (preds, preds[::-1]):
            others = [s for s in graph.successors(skip) if s != node]
            if any(o == main or nx.has_path(graph, o, main) for o in others):
                data["residual"] = True
                break


def _add_region_clusters(ctx: Context, graph: nx.MultiDiGraph) -> None:
    clusters: dict[str, dict[str, Any]] = graph.graph["clusters"]
    framed = {data["region"] for _, data in graph.nodes(data=True)} | {
        node.split("/", 1)[1] for node, data in graph.nodes(data=True) if data["kind"] == "region"
    }
    body = region_body(ctx.report)
    region_ids = _Counter()
    for rec in ctx.report.nodes:
        # A frame for every region that a drawn box stands in: its region node, or the module
        # call that holds the whole region and begins inside it.
        if rec.kind != "region" or rec.name not in framed:
            continue
        name = rec.name
        inside = body.get(name, [])
        enabled = inside[0].autocast if inside else "enabled" in rec.reason
        clusters[f"region/{name}"] = {
            "kind": "region",
            "id": region_ids.next(f"region/{rec.module}" if rec.module else "region"),
            "path": rec.module,
            "count": 1,
            "label": "autocast enabled" if enabled else "autocast disabled",
            "enabled": enabled,
            "depth": len(rec.stack) - 0.5,
        }
    for _, data in graph.nodes(data=True):
        chain = list(data["layers"])
        region = data["region"]
        if data["kind"] == "region":
            region = data["members"][0]  # the region node is drawn inside its own frame
        cid = f"region/{region}" if region else None
        while cid is not None and cid in clusters:
            chain.append((clusters[cid]["depth"], cid))
            outer = ctx.records[cid.split("/", 1)[1]].region
            cid = f"region/{outer}" if outer else None
        data["chain"] = tuple(c for _, c in sorted(chain))


def _finish_titles(graph: nx.MultiDiGraph) -> None:
    """Names as a reader sees them: relative to the innermost folded layer around the node."""
    clusters = graph.graph["clusters"]
    for _, data in graph.nodes(data=True):
        base = None
        for cid in data["chain"]:
            if clusters[cid]["kind"] == "fold":
                base = clusters[cid]["path"]
        rel = relative_path(data["path"], base)
        if data["kind"] == "module":
            data["title"] = rel or data["path"] or ""
            data["subtitle"] = data["cls"]
        elif data["kind"] in ("op", "region"):
            title = data["cls"]
            if data["kind"] == "op" and data["op"] in ("add", "add_") and data["residual"]:
                title = "residual add"
            data["title"] = title
            data["subtitle"] = rel
        else:
            data["title"] = data["cls"]
            data["subtitle"] = "model input" if data["kind"] == "input" else "model output"


class _Counter:
    """Hands out ``base``, then ``base.1``, ``base.2``... for repeated bases."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def next(self, base: str) -> str:
        n = self.seen.get(base, 0)
        self.seen[base] = n + 1
        return base if n == 0 else f"{base}.{n}"


def element_id(data: dict[str, Any], clusters: dict[str, dict[str, Any]]) -> str:
    """The base of a box's element id: from what the box is, never from its place in the graph.

    A module call is ``module/PATH`` (``@N`` for a module's later calls), a free op
    ``op/PATH/OP`` (PATH: the module it runs in), a model input ``input/NAME``, a region's
    value ``region/PATH/output``. Node names of the traced graph (``add_3``) are not used: they
    number ops in graph order, so one added op would rename every later box. Repeats of a base
    inside one diagram get ``.1``, ``.2``... in execution order (:func:`build_graph`).

    >>> element_id({"kind": "op", "op": "add", "path": "model.layers.0", "members": ("add_7",)}, {})
    'op/model.layers.0/add'
    >>> element_id({"kind": "input", "cls": "input_ids", "members": ("input_ids",)}, {})
    'input/input_ids'
    """
    kind = data["kind"]
    if kind == "module":
        return f"module/{data['call']}"
    if kind in ("input", "output"):
        return f"{kind}/{data['members'][0]}"
    if kind == "region":
        cluster = clusters.get(f"region/{data['members'][0]}")
        return f"{cluster['id']}/output" if cluster else f"region/{data['path'] or ''}/output"
    path = data.get("path")
    return f"op/{path}/{data['op']}" if path else f"op/{data['op']}"


def _assign_ids(graph: nx.MultiDiGraph) -> None:
    ids = _Counter()
    clusters = graph.graph["clusters"]
    for node in sorted(graph.nodes, key=lambda n: graph.nodes[n]["order"]):
        data = graph.nodes[node]
        data["id"] = ids.next(element_id(data, clusters))
