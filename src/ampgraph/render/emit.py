"""Writes one diagram graph's boxes, frames and edges into a Graphviz graph.

Nodes are written in execution order inside their clusters (folded layers, autocast regions),
edges in the order of their endpoints; nothing depends on dict or set iteration order. The
overview writes several graphs into one figure, their ids prefixed by the setting.

This module is torch-free.

>>> import networkx as nx
>>> from ampgraph.render.style import THEMES
>>> g = nx.MultiDiGraph(clusters={})
>>> Emitter(g, THEMES["light"]).first() is None
True
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any, Final

import graphviz
import networkx as nx

from ampgraph.render.labels import (
    NBSP,
    dot_name,
    dot_string,
    edge_attrs,
    font,
    html_text,
    node_attrs,
    write_edge,
)
from ampgraph.render.style import (
    FOLD_MARK,
    FONT,
    FONT_SIZE,
    GRAPH_ATTRS,
    SMALL_FONT_SIZE,
    TITLE_FONT_SIZE,
    Theme,
)
from ampgraph.render.tooltips import cluster_tooltip, edge_tooltip, node_tooltip

#: Room between a cluster's frame and its boxes; thick promotion borders need more than the default 8.
CLUSTER_MARGIN: Final = "14"


def _cluster_attrs(cluster: dict[str, Any], theme: Theme) -> dict[str, str]:
    # No cluster label: dot routes edges through a cluster's label, so the frame's caption is a
    # node instead (see Emitter._caption), which edges go around.
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
        return "<" + font(f"<B>{html_text(cluster['label'])}</B>", colour=theme.region_border) + ">"
    text = f"<B>{html_text(cluster['label'])}</B>"
    count = cluster["count"]
    if count > 1:
        text += NBSP * 2 + font(f"<B>{FOLD_MARK}{count}</B>", size=17)
        text += "<BR/>" + font(
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
class Emitter:
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
            write_edge(
                target,
                src,
                dst,
                id=dot_name(f"{src}->{dst}[{dtype or 'unknown'}]"),
                tooltip=dot_string(edge_tooltip(self.graph, u, v, dtype)),
                **edge_attrs(dtype, self.theme, compact=self.compact),
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
                dot_name(name),
                id=dot_name(name),
                tooltip=dot_string(node_tooltip(self.graph, node)),
                **node_attrs(self.graph.nodes[node], self.theme, compact=self.compact),
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
            with target.subgraph(name=dot_name(f"cluster_{self.cluster_id(cid)}")) as sub:
                sub.attr(
                    id=dot_name(self.cluster_id(cid)),
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
            dot_name(caption),
            id=dot_name(caption),
            label=cluster_caption(cluster, self.theme),
            tooltip=dot_string(cluster_tooltip(cluster)),
            shape="plain",
            fontcolor=self.theme.text,
            fontsize="13",
        )
        with target.subgraph() as same:
            same.attr(rank="same")
            same.node(dot_name(caption))
            same.node(dot_name(self.node_id(first)))

    def inputs_on_top(self, target: graphviz.Digraph) -> None:
        """Model inputs on the first rank, as in the seed's drawings, however deep they are read
        (otherwise dot may place an attention mask inside a layer's frame)."""
        inputs = [
            n for n in sorted(self.graph.nodes, key=lambda n: self.graph.nodes[n]["order"])
            if self.graph.nodes[n]["kind"] == "input" and not self.graph.nodes[n]["chain"]
        ]  # fmt: skip
        if inputs:
            with target.subgraph(name=dot_name(f"{self.prefix}inputs")) as top:
                top.attr(rank="min")
                for node in inputs:
                    top.node(dot_name(self.node_id(node)))

    def first(self) -> str | None:
        nodes = sorted(self.graph.nodes, key=lambda n: self.graph.nodes[n]["order"])
        return self.node_id(nodes[0]) if nodes else None

    def last(self) -> str | None:
        nodes = sorted(self.graph.nodes, key=lambda n: self.graph.nodes[n]["order"])
        return self.node_id(nodes[-1]) if nodes else None


#: Titles longer than this many characters (none of the four presets' is) are set on lines of at
#: most ``TITLE_LINE``.
TITLE_WRAP = 72
TITLE_LINE = 40


def new_digraph(name: str, title: str, subtitle: str, theme: Theme) -> graphviz.Digraph:
    """An empty figure in ``theme`` with its title and subtitle above the boxes."""
    dot = graphviz.Digraph(dot_name(name))  # the model's name: a class's, or the spec
    # A long title (a recipe's setting, a file:factory spec) would set the figure's width and
    # shrink a narrow graph to nothing when a page scales it: it is set on lines of a few words.
    lines = [title]
    if len(title) > TITLE_WRAP:
        lines = textwrap.wrap(title, TITLE_LINE, break_long_words=False, break_on_hyphens=False)
    heading = "<BR/>".join(f"<B>{html_text(line)}</B>" for line in lines)
    label = (
        f"<{heading}<BR/>"
        + font(html_text(subtitle), colour=theme.muted, size=FONT_SIZE)
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
