"""Graphviz diagrams of a report's dtype flow: what documentation embeds.

Torch-free: the renderer reads :class:`~ampgraph.report.records.Report` records (or their JSON) and
never imports torch, so diagrams can be redrawn from a saved report anywhere Graphviz runs.

* :func:`to_dot` -- Graphviz source (needs no Graphviz installation).
* :func:`render_svg` -- the laid-out SVG text (needs Graphviz's ``dot``); Jupyter shows a
  :class:`~ampgraph.report.records.Report` through it.
* :func:`render_files` -- one file per report and format, plus a 2x2 overview, written atomically.
* :func:`diagram` / :func:`overview_diagram` -- the source with the title and description that
  :func:`lay_out` writes into the SVG for screen readers.
* :func:`ampgraph.render.html.html_page` -- one self-contained interactive page of several
  settings (``render --format html``); :mod:`ampgraph.render.explorer` -- Google Model
  Explorer's graph JSON and node-data overlays (``render --format explorer``). Both read
  :mod:`~ampgraph.render.page_data`'s records of a report, so they say the same thing.

Every box and edge has a tooltip with its full record (op, module path, dtypes, policy, casts,
promotion, check) and an element id made from module paths, stable when the graph around it
changes: ``module/model.decoder.layers.0.fc1``, ``op/model.decoder.layers.0/add.1``,
``module/...fc1->module/...fc2[bfloat16]``.

>>> import tempfile, torch
>>> from ampgraph import analyze
>>> from ampgraph.render import render_files
>>> report = analyze(torch.nn.Linear(4, 4), "amp-fp32", args=(torch.randn(2, 4),))
>>> [path.name for path in render_files([report], tempfile.mkdtemp(), formats=("svg", "dot"))]
['Linear-cuda-bf16-amp-fp32.svg', 'Linear-cuda-bf16-amp-fp32.dot']

One job per module: :mod:`~ampgraph.render.graph` builds the graph (views, collapsing) from
:mod:`~ampgraph.render.boxes` (what a box holds), :mod:`~ampgraph.render.folded_layers` (repeated layers
drawn once) and :mod:`~ampgraph.render.backward_diagram` (the backward pass);
:mod:`~ampgraph.render.style` holds colours and shapes as data; :mod:`~ampgraph.render.dot` writes
Graphviz source with :mod:`~ampgraph.render.labels` (labels, escaping),
:mod:`~ampgraph.render.tooltips`, :mod:`~ampgraph.render.emit` (boxes, frames, edges) and
:mod:`~ampgraph.render.legend`; :mod:`~ampgraph.render.overview` draws several settings in one
grid; :mod:`~ampgraph.render.svg` makes the SVG accessible; :mod:`~ampgraph.render.files` runs
``dot`` and writes files.
"""

from __future__ import annotations

from ampgraph.errors import RenderError
from ampgraph.render.dot import Diagram, diagram, to_dot
from ampgraph.render.files import FORMATS, lay_out, render_files, render_svg
from ampgraph.render.graph import VIEWS, build_graph
from ampgraph.render.overview import overview_diagram
from ampgraph.render.style import THEMES

__all__ = [
    "FORMATS",
    "THEMES",
    "VIEWS",
    "Diagram",
    "RenderError",
    "build_graph",
    "diagram",
    "lay_out",
    "overview_diagram",
    "render_files",
    "render_svg",
    "to_dot",
]
