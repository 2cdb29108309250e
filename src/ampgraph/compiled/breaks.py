"""Graph breaks: a model's ``torch.compiler.disable`` regions, where ``torch.compile`` stops one
graph, runs the region eagerly and starts another.

The capture traces through such a region and marks its nodes
(:data:`ampgraph.capture.disabled.REGION`). Here the captured graph is split where Dynamo splits
it (``torch.fx.passes.split_module``): each run of nodes outside a region is one graph, which
Inductor plans as :func:`ampgraph.compiled.inductor.plan` plans a whole one; each region's nodes
are ``eager``, rounded as eager rounds them. Values that cross a border are a compiled graph's
outputs or inputs: stored, so rounded there as in eager.

>>> import torch
>>> has_breaks(torch.fx.symbolic_trace(torch.nn.ReLU()))
False
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from torch import fx

from ampgraph.capture.disabled import REGION
from ampgraph.capture.trace import Capture
from ampgraph.compiled.flow import CompiledFlow

_NAME = "ampgraph_captured_name"


def has_breaks(gm: fx.GraphModule) -> bool:
    """Whether a captured graph has nodes of a ``torch.compiler.disable`` region."""
    return any(REGION in n.meta for n in gm.graph.nodes)


def _partitions(gm: fx.GraphModule) -> dict[fx.Node, int]:
    """Each node's part: a new one wherever the graph enters or leaves a region."""
    part: dict[fx.Node, int] = {}
    current, inside = 0, None
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        here = n.meta.get(REGION)
        if part and here != inside:
            current += 1
        inside, part[n] = here, current
    return part


def plan_with_breaks(
    capture: Capture, merged: CompiledFlow, plan_one: Any, eager_nodes: Any
) -> CompiledFlow:  # fmt: skip
    """The plan of a graph with breaks, into ``merged`` (a flow without nodes, its torch and
    options said): ``plan_one(capture, graph_module, example_inputs)`` plans each compiled part
    (a :class:`CompiledFlow`), ``eager_nodes(nodes)`` gives a region's records."""
    from torch.fx.passes.split_module import split_module

    gm = capture.graph_module
    part = _partitions(gm)
    for n in part:  # split_module names its copies after their targets: the meta keeps ours
        n.meta[_NAME] = n.name
    try:
        split = split_module(gm, None, lambda n: part[n], keep_original_order=True)
    finally:
        for n in part:
            n.meta.pop(_NAME, None)
    by_name = {n.name: n for n in gm.graph.nodes}
    regions: list[str] = []
    compiled = 0
    for index in sorted(set(part.values())):
        members = [n for n, p in part.items() if p == index]
        region = members[0].meta.get(REGION)
        if region is not None:
            regions.append(f"{region}: " + ", ".join(n.name for n in members
                                                    if n.op == "call_function"))  # fmt: skip
            flow = CompiledFlow("", "", "", "", {}, eager_nodes(members))
        else:
            sub = getattr(split, f"submod_{index}")
            inputs = [by_name[p.name].meta["val"] for p in sub.graph.nodes if p.op == "placeholder"]
            names = {n.name: n.meta.get(_NAME, n.name) for n in sub.graph.nodes}
            flow = _renamed(plan_one(capture, sub, inputs), f"g{compiled}.", names)
            compiled += 1
        merged = _merge(merged, flow)
    merged.graphs, merged.eager_regions = compiled, regions
    return merged


def _renamed(flow: CompiledFlow, prefix: str, names: dict[str, str]) -> CompiledFlow:
    """``flow`` with the captured graph's node names and its kernel names prefixed by its
    graph's (``op3`` -> ``g1.op3``)."""
    def kernel(k: str | None) -> str | None:
        return None if k is None else prefix + k

    flow.nodes = [replace(n, name=names.get(n.name, n.name), kernel=kernel(n.kernel))
                  for n in flow.nodes]  # fmt: skip
    flow.casts = [replace(c, owner=names.get(c.owner, c.owner), kernel=kernel(c.kernel))
                  for c in flow.casts]  # fmt: skip
    flow.kernels = [replace(k, name=prefix + k.name,
                            nodes=tuple(names.get(x, x) for x in k.nodes)) for k in flow.kernels]  # fmt: skip
    flow.unmapped = [names.get(x, x) for x in flow.unmapped]
    return flow


def _merge(a: CompiledFlow, b: CompiledFlow) -> CompiledFlow:
    a.nodes += b.nodes
    a.casts += b.casts
    a.kernels += b.kernels
    a.unmapped += b.unmapped
    return a
