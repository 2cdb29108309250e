"""From the diagram graph (:mod:`ampgraph.render.graph`) to Graphviz source text.

Labels are Graphviz HTML-like labels (:mod:`ampgraph.render.labels`); colours and shapes come from
:mod:`ampgraph.render.style`; :mod:`ampgraph.render.emit` writes the boxes, frames and edges,
:mod:`ampgraph.render.legend` the legend, :mod:`ampgraph.render.tooltips` the tooltips, titles and
descriptions. Output is deterministic: nodes are written in execution order inside their
clusters, edges in the order of their endpoints, and nothing depends on dict or set iteration
order of the input. The overview of several settings is :mod:`ampgraph.render.overview`'s.

This module is torch-free.

>>> import networkx as nx
>>> g = nx.MultiDiGraph(model="m", setting={"name": "fp32", "device_type": "cuda",
...     "autocast": False, "amp_dtype": "bfloat16", "param_dtype": "float32"},
...     view="modules", fold=True, check=None, clusters={})
>>> "digraph" in graph_to_dot(g)
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import networkx as nx

from ampgraph.errors import RenderError
from ampgraph.render.emit import Emitter, new_digraph
from ampgraph.render.graph import build_graph
from ampgraph.render.legend import LegendFacts, add_legend, add_memory_panel
from ampgraph.render.style import THEMES
from ampgraph.render.tooltips import describe, subtitle_text, title_text

if TYPE_CHECKING:  # only for annotations: records are plain data the renderer reads, never builds
    from ampgraph.report.records import Report


class Diagram(NamedTuple):
    """A diagram's Graphviz source with the title and description screen readers are given
    (:func:`ampgraph.render.svg.accessible` writes them into the SVG)."""

    source: str
    title: str
    description: str


def graph_to_dot(graph: nx.MultiDiGraph, *, theme: str = "light", name: str = "ampgraph") -> str:
    """Graphviz source for a diagram graph built by :func:`~ampgraph.render.graph.build_graph`."""
    th = THEMES[theme]
    dot = new_digraph(name, title_text(graph), subtitle_text(graph), th)
    emitter = Emitter(graph, th)
    emitter.emit(dot)
    emitter.inputs_on_top(dot)
    last = emitter.last()
    add_legend(dot, LegendFacts.of([graph]), th, [last] if last else [])
    if graph.graph.get("memory"):
        add_memory_panel(dot, graph.graph["memory"], th)
    return dot.source


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
    check_theme(theme)
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


def check_theme(theme: str) -> None:
    """Refuse an unknown theme, naming the known ones.

    >>> check_theme("dark")
    """
    if theme not in THEMES:
        raise RenderError(f"unknown theme {theme!r}: use one of {', '.join(THEMES)}")
