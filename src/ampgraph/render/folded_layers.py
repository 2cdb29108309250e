"""Folding: identical repeated layers drawn once, in a frame marked ``×N``.

Sibling modules ``prefix.0``, ``prefix.1``... (OPT's decoder layers) whose drawn contents are
identical -- same relative paths, classes, ops, policies, dtypes, casts, promotions, and the same
edges -- are drawn once in a cluster marked ``×N``. Runs of identical layers fold separately, so
a layer that differs stays visible between them, its differing boxes marked.

This module is torch-free.

>>> import networkx as nx
>>> g = nx.MultiDiGraph(clusters={})
>>> fold_layers(g, True)
>>> g.graph["clusters"]
{}
"""

from __future__ import annotations

import re
from typing import Any, Final

import networkx as nx

from ampgraph.render.boxes import node_id, relative_path

_INSTANCE_RE: Final = re.compile(r"^(?:(?P<prefix>.+)\.)?(?P<index>\d+)$")


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
        n: index.get(node_id("region", graph.nodes[n]["region"] or "")) for n in members
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


def fold_layers(graph: nx.MultiDiGraph, fold: bool) -> None:
    """Frame repeated layers; with ``fold``, merge each run of identical ones into its first."""
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
