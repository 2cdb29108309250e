"""The backward pass drawn like a forward one: its report, box marks, titles and memory rows.

This module is torch-free.

>>> backward_titles.__module__
'ampgraph.render.backward_diagram'
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Final

import networkx as nx

from ampgraph.errors import RenderError
from ampgraph.render.boxes import CAST_OPS, MATMUL_OPS, Context, dedupe, op_parts, relative_path

if TYPE_CHECKING:  # only for annotations: records are plain data the renderer reads, never builds
    from ampgraph.report.records import Backward, ModuleCall, NodeRecord, Report


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
    nodes = [*_from_the_loss(backward), *_gradient_sinks(report, backward)]
    return replace(
        report,
        nodes=nodes,
        modules=_backward_calls(report, nodes),
        check=backward.check,
        pass_="backward",
        backward=None,
    )


def _from_the_loss(backward: Backward) -> list[NodeRecord]:
    """The backward's records, after one input node ``loss`` that stands for the whole
    reduction: the gradient flows from it."""
    # Records are made from the classes of the ones given: the renderer reads records and
    # imports no module of the report package at run time.
    record = type(backward.nodes[0])
    losses = [r for r in backward.nodes if r.kind == "loss"]
    nodes: list[NodeRecord] = []
    if losses:
        last = losses[-1]
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
    return nodes


def _gradient_sinks(report: Report, backward: Backward) -> list[NodeRecord]:
    """An output node per parameter gradient, in its parameter's module with that module's
    stack: layers fold with it."""
    record = type(backward.nodes[0])
    stacks: dict[str, list[str]] = {}
    for rec in report.nodes:
        if rec.module is not None:
            stacks.setdefault(rec.module, list(rec.stack))
    sinks = []
    for grad in backward.gradients:
        if grad.node is None:
            continue
        module, _, short = grad.parameter.rpartition(".")
        sinks.append(
            record(
                name=f"{GRAD_PREFIX}{grad.parameter}", op="gradient", kind="output",
                target=short, module=module, stack=stacks.get(module, []),
                inputs=[{"node": grad.node, "dtype": grad.dtype}],
                outputs=[grad.dtype], reason=f"gradient of {grad.parameter} ({grad.param_dtype})",
            )
        )  # fmt: skip
    return sinks


def _backward_calls(report: Report, nodes: list[NodeRecord]) -> list[ModuleCall]:
    """The forward's module calls, each holding the backward ops autograd ran for it, ordered by
    their first op: the backward's order, from the loss to the inputs."""
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
    calls.sort(key=lambda c: position[c.nodes[0]])
    return calls


#: 16-bit dtypes: a backward matmul in one of them is worth a line in its box.
HALF_DTYPES: Final = frozenset({"bfloat16", "float16"})


def mark_backward(ctx: Context, graph: nx.MultiDiGraph) -> None:
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
        data["casts"] = dedupe([*data["casts"], *casts])
        data["matmuls"] = tuple(sorted(matmuls.items()))
        if data["kind"] == "module":
            data["in_dtypes"] = (
                dedupe(
                    i["dtype"]
                    for r in records
                    for i in r.inputs
                    if i["node"] in ctx.records and i["node"] not in own
                )
                or data["in_dtypes"]
            )


#: Ops that hand a value on unchanged: a cast's value reaches ``.grad`` through them.
PASS_THROUGH_OPS: Final = frozenset({"alias", "view", "_unsafe_view", "reshape", "t", "detach"})


def _consumers(ctx: Context) -> dict[str, list[str]]:
    """Each node's consumers, in the report's order (built once per diagram: per cast, it made
    the backward view of a 70B-shaped step quadratic, 300 s)."""
    consumers: dict[str, list[str]] = {}
    for rec in ctx.report.nodes:
        for i in rec.inputs:
            consumers.setdefault(i["node"], []).append(rec.name)
    return consumers


def _downstream_aliases(
    ctx: Context, name: str, sinks: dict[str, str | None], consumers: dict[str, list[str]]
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


def backward_titles(graph: nx.MultiDiGraph) -> None:
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
    from ampgraph.report.memory import by_module

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
