"""From a :class:`~ampgraph.report.records.Report` to the graph a diagram draws (a networkx graph).

Two views:

* ``modules``: one box per leaf-module call, plus the free ops that matter to a reader of the
  dtype flow (adds and multiplies of two activations, attention and softmax, matmuls, explicit
  casts that change the dtype, ops with an autocast policy, promotions, autocast regions). Every
  other op (views, reshapes, transposes, dropout, mask arithmetic) is collapsed: edges pass
  through it, carrying the dtype its consumer receives.
* ``ops``: every ATen node.

Parameters and buffers are never drawn as nodes; the casts autocast applies to them are written in
the box of the op that casts them (``casts weight, bias: fp32→bf16``).

Folding: sibling modules ``prefix.0``, ``prefix.1``... (OPT's decoder layers) whose drawn
contents are identical -- same relative paths, classes, ops, policies, dtypes, casts,
promotions, and the same edges -- are drawn once in a cluster marked ``×N``. Runs of identical
layers fold separately, so a layer that differs stays visible between them.

The result is a :class:`networkx.MultiDiGraph` (edges keyed by dtype) whose node attributes are
plain data (see :func:`build_graph`); :mod:`ampgraph.render.dot` turns it into Graphviz source.

This module is torch-free.

>>> from ampgraph import analyze, load_model
>>> g = build_graph(analyze(load_model("llama-tiny"), "amp-fp32", check=False))
>>> g.graph["clusters"]["fold/model.layers.0"]["count"]       # its two decoder layers, drawn once
2
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

import networkx as nx

from ampgraph.errors import RenderError
from ampgraph.policy import lookup
from ampgraph.render.style import is_floating

if TYPE_CHECKING:  # only read: the records module imports the renderer for notebooks
    from ampgraph.report.records import ModuleCall, NodeRecord, Report

VIEWS: Final = ("modules", "ops")
#: Which pass of a training step a diagram draws (``train`` draws both, as two diagrams).
PASSES: Final = ("forward", "backward")


#: Free ops drawn in the module view whenever a floating value goes in.
ATTENTION_OPS: Final = frozenset({
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "softmax", "_softmax", "log_softmax", "_log_softmax",
})  # fmt: skip
MATMUL_OPS: Final = frozenset({
    "matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "einsum", "linear", "conv1d", "conv2d",
    "conv3d", "convolution", "_convolution",
})  # fmt: skip
#: Explicit casts: drawn when they change the dtype (a no-op ``.float()`` on fp32 is collapsed).
CAST_OPS: Final = frozenset({"to", "_to_copy", "type_as", "convert_element_type", "_to_dtype"})
#: Binary arithmetic: drawn when two activations meet (residual adds, gates), where mixed dtypes
#: promote; a multiply by a constant or a parameter is collapsed.
BINARY_OPS: Final = frozenset({"add", "sub", "mul", "div", "add_", "mul_"})

#: How the free ops read in a box title.
OP_TITLE: Final[dict[str, str]] = {
    "scaled_dot_product_attention": "attention (SDPA)",
    "_scaled_dot_product_flash_attention": "attention (flash)",
    "_scaled_dot_product_efficient_attention": "attention (efficient)",
    "_scaled_dot_product_cudnn_attention": "attention (cuDNN)",
    "_softmax": "softmax",
    "_log_softmax": "log_softmax",
    "_to_copy": "cast",
    "to": "cast",
    "type_as": "cast",
    "convert_element_type": "cast",
}

#: Argument names for the activations an op's casts mention (``casts q, k: fp32→bf16``).
ARG_NAMES: Final[dict[str, tuple[str, ...]]] = {
    "scaled_dot_product_attention": ("q", "k", "v", "mask"),
    "_scaled_dot_product_flash_attention": ("q", "k", "v"),
    "_scaled_dot_product_efficient_attention": ("q", "k", "v", "bias"),
    "matmul": ("a", "b"),
    "mm": ("a", "b"),
    "bmm": ("a", "b"),
    "baddbmm": ("input", "a", "b"),
    "addmm": ("bias", "a", "b"),
    "einsum": ("a", "b", "c"),
}

#: Policy precedence for a box holding several ops (a leaf module that runs more than one).
POLICY_PRECEDENCE: Final = (
    "lower_precision_fp", "fp32", "fp32_set_opt_dtype", "fp32_append_dtype", "promote", "banned",
)  # fmt: skip

_INSTANCE_RE: Final = re.compile(r"^(?:(?P<prefix>.+)\.)?(?P<index>\d+)$")


def op_parts(op: str) -> tuple[str, str]:
    """Short op name and overload: ``"aten.add.Tensor"`` -> ``("add", "Tensor")``.

    >>> op_parts("aten.scaled_dot_product_attention.default")
    ('scaled_dot_product_attention', 'default')
    >>> op_parts("getitem")
    ('getitem', '')
    """
    parts = op.split(".")
    if len(parts) >= 2 and parts[0] in ("aten", "prims", "higher_order", "quantized", "_ops"):
        return parts[1], ".".join(parts[2:])
    return parts[-1], ""


def short_class(type_name: str) -> str:
    """``"torch.nn.modules.linear.Linear"`` -> ``"Linear"``."""
    return type_name.rsplit(".", 1)[-1]


def relative_path(path: str | None, base: str | None) -> str:
    """``path`` relative to ``base`` (a folded layer), or ``path`` when it is not below ``base``.

    >>> relative_path("model.decoder.layers.0.self_attn.q_proj", "model.decoder.layers.0")
    'self_attn.q_proj'
    >>> relative_path("model.decoder.layers.0", "model.decoder.layers.0")
    ''
    """
    if not path:
        return ""
    if base:
        if path == base:
            return ""
        if path.startswith(base + "."):
            return path[len(base) + 1 :]
    return path


def short_param_name(target: str | None, module: str | None, fallback: str) -> str:
    """A parameter's name relative to the module that uses it: ``...fc1.weight`` -> ``weight``."""
    if not target:
        return fallback
    if module and target.startswith(module + "."):
        return target[len(module) + 1 :]
    return target.rsplit(".", 1)[-1]


def dominant_policy(policies: Iterable[str | None]) -> str | None:
    """The policy a box shows when its ops have several (lower precision wins over fp32...)."""
    present = {p for p in policies if p}
    return next((p for p in POLICY_PRECEDENCE if p in present), None)


@dataclass
class _Context:
    """Lookups shared by the builders."""

    report: Report
    records: dict[str, NodeRecord]
    device_type: str

    @classmethod
    def of(cls, report: Report) -> _Context:
        return cls(
            report=report,
            records={r.name: r for r in report.nodes},
            device_type=str(report.setting.get("device_type", "cuda")),
        )

    def is_source(self, name: str) -> bool:
        rec = self.records.get(name)
        return rec is None or rec.is_source

    def disagrees(self, rec: NodeRecord) -> bool:
        return rec.check is not None and not rec.check.get("agree", True)


# -- node attributes ---------------------------------------------------------------------------


def _cast_names(ctx: _Context, rec: NodeRecord, module: str | None) -> list[tuple[str, str, str]]:
    """Each cast of ``rec`` as (short name, from, to): activations first, then parameters.

    Parameters go by their name in the module (``weight``); an activation is ``x``, or, where
    several activations meet, by its role in the op (``q``, ``k``) or position (``x1``, ``x2``).
    """
    if not rec.casts:
        return []
    short, _ = op_parts(rec.op)
    roles = ARG_NAMES.get(short, ())
    activations = [i["node"] for i in rec.inputs if not ctx.is_source(i["node"])]
    positions = {i["node"]: k for k, i in enumerate(rec.inputs)}
    acts, params = [], []
    for cast in rec.casts:
        producer = ctx.records.get(cast.node)
        if producer is not None and producer.is_source:
            name = short_param_name(producer.target, module, cast.node)
            params.append((name, cast.from_dtype, cast.to_dtype))
            continue
        if len(activations) <= 1 or cast.node not in activations:
            name = "x"
        elif positions[cast.node] < len(roles):
            name = roles[positions[cast.node]]
        else:
            name = f"x{activations.index(cast.node) + 1}"
        acts.append((name, cast.from_dtype, cast.to_dtype))
    return acts + params


def _dedupe(items: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(dict.fromkeys(items))


def _base_attrs(rec: NodeRecord, order: float) -> dict[str, Any]:
    return {
        "order": order,
        "stack": tuple(rec.stack),
        "path": rec.module,
        "region": rec.region,
        "members": (rec.name,),
        "ops": (rec.op,),
        "policy": None,
        "in_dtypes": (),
        "out_dtype": rec.out_dtype,
        "casts": (),
        "promotion": None,
        "disagree": False,
        "error": rec.error,
        "residual": False,
        "op": None,
        "cls": "",
        "region_enabled": None,
        "layers": (),
        "differs": (),  # labels of neighbouring layers in which this box differs (folding)
    }


def _module_attrs(ctx: _Context, call: ModuleCall, order: int) -> dict[str, Any]:
    members = [ctx.records[n] for n in call.nodes if n in ctx.records]
    first = members[0]
    attrs = _base_attrs(first, order)
    casts = [c for m in members for c in _cast_names(ctx, m, call.path)]
    promotions = [m.promotion for m in members if m.promotion]
    attrs.update(
        kind="module",
        path=call.path,
        # torch.export names a call "L__self__<path>[@n]"; the prefix says nothing to a reader.
        call=call.call.removeprefix("L__self__") or call.path,
        module_type=call.type,
        cls=short_class(call.type),
        members=tuple(call.nodes),
        ops=_dedupe(m.op for m in members),
        policy=dominant_policy(m.policy for m in members),
        in_dtypes=(call.in_dtype,),
        out_dtype=call.out_dtype,
        casts=_dedupe(casts),
        promotion=_promotion_attr(promotions[0]) if promotions else None,
        disagree=any(ctx.disagrees(m) for m in members),
        error=next((m.error for m in members if m.error), None),
        region=first.region,
    )
    return attrs


def _promotion_attr(promotion: dict[str, Any]) -> tuple[tuple[str, ...], str]:
    return (tuple(promotion.get("inputs", ())), str(promotion.get("to")))


def _op_attrs(ctx: _Context, rec: NodeRecord, order: int) -> dict[str, Any]:
    attrs = _base_attrs(rec, order)
    short, _ = op_parts(rec.op)
    ins = tuple(i["dtype"] for i in rec.inputs if not ctx.is_source(i["node"]))
    changes = short in CAST_OPS and rec.out_dtype not in [i["dtype"] for i in rec.inputs[:1]]
    attrs.update(
        kind="op",
        op=short,
        # A .to() that keeps the dtype is no cast; only the op view draws it, under its own name.
        cls=OP_TITLE.get(short, short) if short not in CAST_OPS or changes else short,
        policy=rec.policy,
        in_dtypes=ins,
        casts=_dedupe(_cast_names(ctx, rec, rec.module)),
        promotion=_promotion_attr(rec.promotion) if rec.promotion else None,
        disagree=ctx.disagrees(rec),
    )
    return attrs


def _region_attrs(
    ctx: _Context, rec: NodeRecord, body: Sequence[NodeRecord], order: float
) -> dict[str, Any]:
    attrs = _base_attrs(rec, order)
    if body:
        enabled: bool | None = body[0].autocast
    else:  # an empty body: only the annotator's reason says what the region does
        enabled = "enabled" in rec.reason
    attrs.update(kind="region", op="region", cls="region output", region_enabled=enabled)
    return attrs


def _io_attrs(rec: NodeRecord, order: int) -> dict[str, Any]:
    attrs = _base_attrs(rec, order)
    attrs.update(kind=rec.kind, cls=rec.target or rec.name)
    if rec.kind == "output":
        attrs["in_dtypes"] = tuple(i["dtype"] for i in rec.inputs)
    return attrs


# -- which free ops a module view draws ----------------------------------------------------------


def matters(ctx: _Context, rec: NodeRecord) -> bool:
    """Whether the module view draws a free op (one outside every leaf-module call).

    The test reads only op names, dtypes and the policy tables -- not whether autocast is on --
    so the four settings of a model draw the same boxes and compare side by side.
    """
    if rec.kind == "region":
        return True
    if rec.error or ctx.disagrees(rec) or rec.promotion:
        return True
    short, overload = op_parts(rec.op)
    in_dtypes = [i["dtype"] for i in rec.inputs]
    floating_in = any(is_floating(d) for d in in_dtypes)
    if short in ATTENTION_OPS or short in MATMUL_OPS:
        return floating_in
    if short in CAST_OPS:
        src = in_dtypes[0] if in_dtypes else None
        dst = rec.out_dtype
        return src != dst and (is_floating(src) or is_floating(dst))
    if short in BINARY_OPS:
        activations = [
            i for i in rec.inputs if not ctx.is_source(i["node"]) and is_floating(i["dtype"])
        ]
        return len(activations) >= 2
    category = lookup(ctx.device_type, f"aten::{short}", "" if overload == "default" else overload)
    return category is not None and floating_in


# -- building ------------------------------------------------------------------------------------


def _node_id(kind: str, name: str) -> str:
    # No ':' in ids: Graphviz reads "a:b" in an edge as node a, port b.
    return f"{kind}/{name}"


def _region_body(report: Report) -> dict[str, list[NodeRecord]]:
    body: dict[str, list[NodeRecord]] = {}
    for rec in report.nodes:
        if rec.region is not None:
            body.setdefault(rec.region, []).append(rec)
    return body


def _region_sinks(body: Sequence[NodeRecord]) -> list[NodeRecord]:
    """Body records whose value leaves the region: those no other record of the body consumes."""
    names = {r.name for r in body}
    consumed = {i["node"] for r in body for i in r.inputs if i["node"] in names}
    # A nested region's body has its own sinks; the nested region node stands for them.
    return [r for r in body if r.name not in consumed and r.region == body[0].region]


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
    ctx = _Context.of(report)
    graph = nx.MultiDiGraph(
        model=report.model,
        setting=dict(report.setting),
        view=view,
        fold=fold,
        check=report.check,
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
        _mark_backward(ctx, graph)
    _connect(ctx, graph, owner)
    _drop_unused_inputs(graph)
    _mark_residuals(graph)
    _fold_layers(graph, fold)
    _add_region_clusters(ctx, graph)
    _finish_titles(graph)
    if pass_ == "backward":
        _backward_titles(graph)
        graph.graph["memory"] = memory_rows(source)
    _assign_ids(graph)
    return graph


def _place_nodes(ctx: _Context, graph: nx.MultiDiGraph, view: str) -> dict[str, str]:
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
            node = _node_id("module", call.call.removeprefix("L__self__") or call.path)
            graph.add_node(node, **_module_attrs(ctx, call, min(order[n] for n in members)))
            for name in members:
                owner[name] = node
    body = _region_body(report)
    for rec in report.nodes:
        if rec.name in owner or rec.is_source:
            continue
        k = order[rec.name]
        if rec.kind in ("input", "output"):
            node = _node_id(rec.kind, rec.name)
            graph.add_node(node, **_io_attrs(rec, k))
        elif rec.kind == "region":
            node = _node_id("region", rec.name)
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
            graph.add_node(node, **_region_attrs(ctx, rec, inside, last + 0.5 if inside else k))
        elif view == "ops" or matters(ctx, rec):
            node = _node_id("op", rec.name)
            graph.add_node(node, **_op_attrs(ctx, rec, k))
        else:
            continue
        owner[rec.name] = node
    return owner


def _connect(ctx: _Context, graph: nx.MultiDiGraph, owner: dict[str, str]) -> None:
    """Edges between drawn nodes; collapsed records pass their upstream drawn nodes through."""
    body = _region_body(ctx.report)
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
            return [(s.name, s.out_dtype) for s in _region_sinks(body[rec.name])]
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


# -- folding -------------------------------------------------------------------------------------


def _instance_groups(graph: nx.MultiDiGraph) -> list[tuple[str, list[int]]]:
    """Module paths ``prefix.N`` that repeat, shallowest first, then in order of appearance."""
    groups: dict[str, set[int]] = {}
    first_seen: dict[str, int] = {}
    for _, data in sorted(graph.nodes(data=True), key=lambda nd: nd[1]["order"]):
        for path in data["stack"]:
            match = _INSTANCE_RE.match(path or "")
            if match is None:
                continue
            prefix = match.group("prefix") or ""
            groups.setdefault(prefix, set()).add(int(match.group("index")))
            first_seen.setdefault(prefix, data["order"])
    repeated = [(p, sorted(ix)) for p, ix in groups.items() if len(ix) >= 2]
    repeated.sort(key=lambda pi: (pi[0].count(".") + bool(pi[0]), first_seen[pi[0]]))
    return repeated


def _instance_path(prefix: str, index: int) -> str:
    return f"{prefix}.{index}" if prefix else str(index)


def _members(graph: nx.MultiDiGraph, path: str) -> list[str]:
    found = [n for n, d in graph.nodes(data=True) if path in d["stack"]]
    return sorted(found, key=lambda n: graph.nodes[n]["order"])


def _signature(graph: nx.MultiDiGraph, path: str, members: list[str]) -> tuple[Any, ...]:
    """Everything a reader would see of one layer, with names relative to the layer."""
    index = {n: k for k, n in enumerate(members)}
    region_index = {
        n: index.get(_node_id("region", graph.nodes[n]["region"] or "")) for n in members
    }
    nodes = []
    for n in members:
        d = graph.nodes[n]
        nodes.append((
            d["kind"], relative_path(d["path"], path), d["cls"], d["op"], d["policy"],
            d["in_dtypes"], d["out_dtype"], d["casts"], d["promotion"], d["residual"],
            d["disagree"], d["error"], d["region_enabled"], region_index[n],
        ))  # fmt: skip
    edges = []
    for n in members:
        for u, _, key in graph.in_edges(n, keys=True):
            edges.append(("in", index.get(u, -1), index[n], key))
        for _, v, key in graph.out_edges(n, keys=True):
            if v not in index:
                edges.append(("out", index[n], -1, key))
    return (tuple(nodes), tuple(sorted(set(edges), key=repr)))


def _fold_layers(graph: nx.MultiDiGraph, fold: bool) -> None:
    clusters: dict[str, dict[str, Any]] = graph.graph["clusters"]
    for prefix, indices in _instance_groups(graph):
        instances = []
        for i in indices:
            path = _instance_path(prefix, i)
            members = _members(graph, path)
            if members:
                instances.append((i, path, members))
        sigs = {inst[1]: _signature(graph, inst[1], inst[2]) for inst in instances}
        runs: list[list[tuple[int, str, list[str]]]] = []
        repeats = False  # whether any two neighbours are identical: then these are "layers"
        for inst in instances:
            consecutive = bool(runs) and runs[-1][-1][0] + 1 == inst[0]
            same = consecutive and sigs[inst[1]] == sigs[runs[-1][-1][1]]
            repeats |= same
            if fold and same:
                runs[-1].append(inst)
            else:
                runs.append([inst])
        if not repeats:
            # Numbered siblings that never repeat (T5's layer.0 attention, layer.1 MLP) are
            # not layers of a stack: frames around them would only add noise.
            continue
        labels = [
            f"{_instance_path(prefix, run[0][0])}–{run[-1][0]}" if len(run) > 1 else run[0][1]
            for run in runs
        ]
        if fold:
            # Boxes name the other layers briefly: "layers.0–4", not the full module path.
            tail = prefix.rsplit(".", 1)[-1]
            short = [label[len(prefix) - len(tail) :] if tail else label for label in labels]
            _mark_differences(graph, runs, short, sigs)
        for run, label in zip(runs, labels):
            _, first_path, first_members = run[0]
            if len(run) > 1:
                _merge_run(graph, run)
            elif len(first_members) < 2:
                continue  # a lone box needs no frame
            cid = f"fold/{first_path}"
            clusters[cid] = {
                "kind": "fold", "id": cid, "path": first_path, "count": len(run), "label": label,
            }  # fmt: skip
            for n in first_members:
                d = graph.nodes[n]
                depth = float(d["stack"].index(first_path))
                d["layers"] = (*d["layers"], (depth, cid))


def _mark_differences(
    graph: nx.MultiDiGraph,
    runs: list[list[tuple[int, str, list[str]]]],
    labels: list[str],
    sigs: dict[str, tuple[Any, ...]],
) -> None:
    """Where neighbouring runs of layers differ box by box, say so on the boxes that differ.

    Folding keeps a differing layer visible; this points the reader at what differs in it.
    """
    for k in range(1, len(runs)):
        (_, path_a, members_a), (_, path_b, members_b) = runs[k - 1][0], runs[k][0]
        nodes_a, nodes_b = sigs[path_a][0], sigs[path_b][0]
        if len(nodes_a) != len(nodes_b):
            continue  # different structure: the boxes themselves show it
        for j, (sig_a, sig_b) in enumerate(zip(nodes_a, nodes_b)):
            if sig_a != sig_b:
                a, b = graph.nodes[members_a[j]], graph.nodes[members_b[j]]
                a["differs"] = (*a["differs"], labels[k])
                b["differs"] = (*b["differs"], labels[k - 1])


def _merge_run(graph: nx.MultiDiGraph, run: list[tuple[int, str, list[str]]]) -> None:
    """Redirect the edges of every instance but the first onto the first; drop the rest."""
    keep = run[0][2]
    instance_of = {n: k for k, (_, _, members) in enumerate(run) for n in members}
    mapping = {n: keep[j] for _, _, members in run[1:] for j, n in enumerate(members)}
    for n in mapping:
        for u, v, key, data in list(graph.in_edges(n, keys=True, data=True)) + list(
            graph.out_edges(n, keys=True, data=True)
        ):
            if u in instance_of and v in instance_of and instance_of[u] != instance_of[v]:
                continue  # layer k -> layer k+1: the repetition the ×N mark stands for
            a, b = mapping.get(u, u), mapping.get(v, v)
            if a != b and not graph.has_edge(a, b, key):
                graph.add_edge(a, b, key=key, **data)
    graph.remove_nodes_from(list(mapping))


def _add_region_clusters(ctx: _Context, graph: nx.MultiDiGraph) -> None:
    clusters: dict[str, dict[str, Any]] = graph.graph["clusters"]
    framed = {data["region"] for _, data in graph.nodes(data=True)} | {
        node.split("/", 1)[1] for node, data in graph.nodes(data=True) if data["kind"] == "region"
    }
    body = _region_body(ctx.report)
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


# -- stable element ids ----------------------------------------------------------------------------


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


# -- the backward pass -----------------------------------------------------------------------------

#: Prefix of the node names given to gradient sinks (no ATen node is named so).
GRAD_PREFIX: Final = "grad."


def backward_report(report: Report) -> Report:
    """The backward of a training step as a report the builders read like a forward one.

    Its nodes are the backward's records in the order autograd ran them, with the loss as the
    one input (the gradient starts there) and one output per parameter gradient, placed in the
    parameter's module so that folded layers keep their gradients. Its module calls are the
    forward's, each holding the backward ops autograd ran for it: a box is "the backward of
    fc1". Values the backward reads from the forward (saved activations, parameters) have no
    record here and are treated like parameters: not drawn, as the forward view draws none.
    """
    backward = report.backward
    if backward is None or backward.skipped or not backward.nodes:
        why = "it is a forward pass" if backward is None else backward.skipped or "no backward ops"
        raise RenderError(
            f"no backward to draw in the report of {report.model}: {why} "
            "(analyse with --pass backward or --pass train)"
        )
    # ampgraph.report.records imports the renderer (a report draws itself in a notebook), so records
    # are made here from the classes of the ones given, not imported.
    record = type(backward.nodes[0])
    losses = [r for r in backward.nodes if r.kind == "loss"]
    nodes: list[NodeRecord] = []
    if losses:
        last = losses[-1]
        # The loss stands for the whole reduction: the gradient flows from it.
        nodes.append(
            record(
                name="loss", op="loss", kind="input",
                target=f"loss = {backward.loss.get('expression', 'loss')}",
                outputs=list(last.outputs),
            )
        )  # fmt: skip
    # The loss's element id is "input/loss", not its traced node's name (which numbering moves).
    loss_name = losses[-1].name if losses else None
    for rec in backward.nodes:
        if rec.kind == "loss":
            continue
        if any(i["node"] == loss_name for i in rec.inputs):
            inputs = [{**i, "node": "loss"} if i["node"] == loss_name else i for i in rec.inputs]
            rec = replace(rec, inputs=inputs)
        nodes.append(rec)
    # A gradient sits in its parameter's module, with that module's stack: layers fold with it.
    stacks: dict[str, list[str]] = {}
    for rec in report.nodes:
        if rec.module is not None:
            stacks.setdefault(rec.module, list(rec.stack))
    for grad in backward.gradients:
        if grad.node is None:
            continue
        module, _, short = grad.parameter.rpartition(".")
        nodes.append(
            record(
                name=f"{GRAD_PREFIX}{grad.parameter}", op="gradient", kind="output",
                target=short, module=module, stack=stacks.get(module, []),
                inputs=[{"node": grad.node, "dtype": grad.dtype}],
                outputs=[grad.dtype], reason=f"gradient of {grad.parameter} ({grad.param_dtype})",
            )
        )  # fmt: skip
    names = {r.name for r in nodes}
    position: dict[str, int] = {}
    for k, r in enumerate(nodes):
        position.setdefault(r.name, k)
    # One pass over the nodes, not one per module call: a 70B-shaped step has 17,000 backward
    # nodes and 800 calls.
    members_of: dict[str, list[str]] = {}
    for r in nodes:
        if r.kind == "op" and r.module_call is not None:
            members_of.setdefault(r.module_call, []).append(r.name)
    calls = []
    for call in report.modules:
        members = members_of.get(call.call, [])
        if not members:
            continue
        first, final = nodes[position[members[0]]], nodes[position[members[-1]]]
        calls.append(
            replace(
                call, type=call.type, bases=list(call.bases), call=call.call,
                in_dtype=next(
                    (i["dtype"] for i in first.inputs if i["node"] in names), first.out_dtype
                ),
                out_dtype=final.out_dtype, nodes=list(members),
            )
        )  # fmt: skip
    # Boxes are ordered by their first op: the backward's order, from the loss to the inputs.
    calls.sort(key=lambda c: position[c.nodes[0]])
    return replace(
        report, nodes=nodes, modules=calls, check=backward.check, pass_="backward", backward=None
    )


#: 16-bit dtypes: a backward matmul in one of them is worth a line in its box.
HALF_DTYPES: Final = frozenset({"bfloat16", "float16"})


def _mark_backward(ctx: _Context, graph: nx.MultiDiGraph) -> None:
    """Name the backward's casts and count its 16-bit matmuls, in each box, before folding (so
    that layers fold only where these agree too)."""
    gradient_of = {
        r.inputs[0]["node"]: r.target for r in ctx.report.nodes if r.name.startswith(GRAD_PREFIX)
    }
    consumers = _consumers(ctx)
    for _, data in graph.nodes(data=True):
        if data["kind"] not in ("module", "op"):
            continue
        records = [ctx.records[m] for m in data["members"] if m in ctx.records]
        own = set(data["members"])
        casts = []
        matmuls: dict[str, int] = {}
        for rec in records:
            short, _ = op_parts(rec.op)
            if short in MATMUL_OPS and rec.out_dtype in HALF_DTYPES:
                matmuls[short] = matmuls.get(short, 0) + 1
            src = rec.inputs[0]["dtype"] if rec.inputs else None
            if short in CAST_OPS and src != rec.out_dtype and src and rec.out_dtype:
                # A dtype change in the backward is autograd casting a gradient
                # (ToCopyBackward, or the engine matching a parameter's dtype); named by the
                # parameter whose gradient it makes, where it ends in one.
                sinks = [
                    gradient_of[n]
                    for n in _downstream_aliases(ctx, rec.name, gradient_of, consumers)
                ]
                name = f"{sinks[0]} grad" if sinks else "grad"
                casts.append((name, src, rec.out_dtype))
        # Autocast's own casts (backward inside the context) stay, the gradients' come after.
        data["casts"] = _dedupe([*data["casts"], *casts])
        data["matmuls"] = tuple(sorted(matmuls.items()))
        if data["kind"] == "module":
            data["in_dtypes"] = (
                _dedupe(
                    i["dtype"]
                    for r in records
                    for i in r.inputs
                    if i["node"] in ctx.records and i["node"] not in own
                )
                or data["in_dtypes"]
            )


#: Ops that hand a value on unchanged: a cast's value reaches ``.grad`` through them.
PASS_THROUGH_OPS: Final = frozenset({"alias", "view", "_unsafe_view", "reshape", "t", "detach"})


def _consumers(ctx: _Context) -> dict[str, list[str]]:
    """Each node's consumers, in the report's order (built once per diagram: per cast, it made
    the backward view of a 70B-shaped step quadratic, 300 s)."""
    consumers: dict[str, list[str]] = {}
    for rec in ctx.report.nodes:
        for i in rec.inputs:
            consumers.setdefault(i["node"], []).append(rec.name)
    return consumers


def _downstream_aliases(
    ctx: _Context, name: str, sinks: dict[str, str | None], consumers: dict[str, list[str]]
) -> list[str]:
    """The gradient-sink producers ``name``'s value reaches unchanged (through aliases and
    views, at most three): a cast is named by a parameter only where it makes that gradient,
    not where the gradient is later computed from it. ``consumers``: :func:`_consumers`."""
    frontier, found = [name], []
    for _ in range(4):
        found += [n for n in frontier if n in sinks]
        frontier = [
            c
            for n in frontier
            for c in consumers.get(n, [])
            if c in ctx.records and op_parts(ctx.records[c].op)[0] in PASS_THROUGH_OPS
        ]
    return found


def _backward_titles(graph: nx.MultiDiGraph) -> None:
    """Every backward box says which forward module it is the backward of; gradients say whose."""
    clusters = graph.graph["clusters"]
    for _, data in graph.nodes(data=True):
        if data["kind"] == "module":
            data["title"] = f"backward of {data['title']}"
        elif data["kind"] == "op" and data["subtitle"]:
            data["subtitle"] = f"backward of {data['subtitle']}"
        elif data["kind"] == "output":
            base = None
            for cid in data["chain"]:
                if clusters[cid]["kind"] == "fold":
                    base = clusters[cid]["path"]
            rel = relative_path(data["path"], base)
            data["title"] = f"{rel}.{data['cls']}.grad" if rel else f"{data['cls']}.grad"
            data["subtitle"] = "parameter gradient"
        elif data["kind"] == "input":
            data["subtitle"] = "the gradient starts here"


def memory_rows(report: Report) -> list[tuple[str, dict[str, int]]]:
    """Saved-for-backward bytes per layer and dtype (a panel beside the backward diagram).

    A layer is a module path up to its first list index (``model.decoder.layers.3``), or the
    whole path of a module outside every list; rows keep the order the forward saved them in.
    """
    from ampgraph.train.memory import by_module

    backward = report.backward
    if backward is None:
        return []
    rows: dict[str, dict[str, int]] = {}
    for path, dtypes in by_module(backward.saved).items():
        layer = _layer_of(path)
        row = rows.setdefault(layer, {})
        for dtype, n in dtypes.items():
            row[dtype] = row.get(dtype, 0) + n
    return list(rows.items())


def _layer_of(path: str) -> str:
    """``model.decoder.layers.3.fc1`` -> ``model.decoder.layers.3``; a path without an index
    stays whole."""
    parts = path.split(".")
    for k, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: k + 1])
    return path
