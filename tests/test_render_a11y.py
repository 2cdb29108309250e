"""Diagrams that reward a closer look: a tooltip on every box and edge, stable element ids, and a
title and description for screen readers.

The SVG is read as a browser reads it (XML, ``xlink:title`` is what a hover shows); the ids are
checked against a model whose graph node names shift while its boxes stay the same.
"""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ampgraph.render import build_graph, overview_diagram, render_svg, to_dot
from ampgraph.render.svg import accessible
from ampgraph.report.records import Report

DATA = Path(__file__).parent / "data"
SVG = "{http://www.w3.org/2000/svg}"
XLINK_TITLE = "{http://www.w3.org/1999/xlink}title"

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is missing")


def opt_report() -> Report:
    return Report.from_json((DATA / "opt-125m-amp-fp32.json").read_text())


def tooltips(svg: str) -> dict[str, tuple[str, str | None]]:
    """Element id -> (class, its hover text) for every drawn node and edge of an SVG."""
    root = ET.fromstring(svg)
    found = {}
    for group in root.iter(f"{SVG}g"):
        cls = group.get("class")
        if cls not in ("node", "edge"):
            continue
        link = group.find(f".//{SVG}a")
        found[group.get("id", "")] = (cls, None if link is None else link.get(XLINK_TITLE))
    return found


@needs_dot
def test_every_box_and_edge_has_a_tooltip_with_its_full_record() -> None:
    shown = tooltips(render_svg(opt_report()))
    boxes = {k: v for k, v in shown.items() if v[0] == "node"}
    edges = {k: v for k, v in shown.items() if v[0] == "edge"}
    graph = build_graph(opt_report())
    # Every box of the graph, plus the frame's caption and the legend; every edge.
    assert len(boxes) == graph.number_of_nodes() + 2
    assert len(edges) == graph.number_of_edges()
    assert all(tip for _, tip in shown.values()), [k for k, (_, t) in shown.items() if not t]
    fc1 = boxes["module/model.decoder.layers.0.fc1"][1]
    assert fc1 is not None
    assert fc1.splitlines() == [
        "model.decoder.layers.0.fc1 (torch.nn.modules.linear.Linear)",
        (
            "drawn once for model.decoder.layers.0–11: 12 identical layers "
            "(names are model.decoder.layers.0's)"
        ),
        "op: aten.linear.default",
        "dtypes: float32 → bfloat16",
        "autocast policy: lower precision (lower_precision_fp)",
        "autocast casts: x float32→bfloat16, weight float32→bfloat16, bias float32→bfloat16",
        "dispatcher check: agrees",
        f"graph node: {graph.nodes['module/model.decoder.layers.0.fc1']['members'][0]}",
    ]
    residual = boxes["op/model.decoder.layers.0/add"][1]
    assert residual is not None and "type promotion: float32 + bfloat16 → float32" in residual
    edge = edges[
        "module/model.decoder.layers.0.fc1->module/model.decoder.layers.0.activation_fn[bfloat16]"
    ][1]
    assert edge == "model.decoder.layers.0.fc1 → model.decoder.layers.0.activation_fn\n" \
        "carries bfloat16"  # fmt: skip


def test_ids_are_unique_in_the_overview_and_prefixed_by_setting() -> None:
    report = opt_report()
    other = Report.from_dict({**report.to_dict(), "setting": {**report.setting, "name": "other"}})
    source = overview_diagram([report, other]).source
    ids = [line.split('id="', 1)[1].split('"', 1)[0] for line in source.splitlines()
           if ' id="' in line]  # fmt: skip
    assert len(ids) == len(set(ids))
    assert "amp-fp32/module/model.decoder.layers.0.fc1" in ids
    assert "other/module/model.decoder.layers.0.fc1" in ids


def shifted_models() -> tuple[Report, Report]:
    """The same block twice; the second has an extra op first, which renames every graph node
    after it (``add`` becomes ``add_1``)."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from ampgraph import analyze

    class Twice(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + x

    class Block(nn.Module):
        def __init__(self, extra: bool) -> None:
            super().__init__()
            self.pre = Twice() if extra else nn.Identity()
            self.fc1 = nn.Linear(4, 4)
            self.fc2 = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.pre(x)
            return x + self.fc2(self.fc1(x))

    args = (torch.randn(2, 4),)
    return (
        analyze(Block(False), "amp-fp32", args=args, check=False),
        analyze(Block(True), "amp-fp32", args=args, check=False),
    )


def test_ids_come_from_module_paths_not_graph_order() -> None:
    plain, shifted = shifted_models()
    ids = {}
    for name, report in (("plain", plain), ("shifted", shifted)):
        graph = build_graph(report)
        ids[name] = {d["id"]: d["members"] for _, d in graph.nodes(data=True)}
    # The residual add is another graph node in the shifted model, with the same element id.
    assert ids["plain"]["op/add"] == ("add",)
    assert ids["shifted"]["op/add"] == ("add_1",)
    assert set(ids["plain"]) - {"module/pre"} <= set(ids["shifted"])
    for report in (plain, shifted):
        assert 'id="op/add"' in to_dot(report)


def test_svg_has_a_title_and_description_for_screen_readers() -> None:
    svg = (
        '<?xml version="1.0"?>\n<svg width="1pt"\n viewBox="0 0 1 1" '
        'xmlns="http://www.w3.org/2000/svg">\n<g/>\n</svg>\n'
    )
    once = accessible(svg, "t & t", "a <b> c")
    assert accessible(once, "t & t", "a <b> c") == once
    root = ET.fromstring(once.encode())
    assert root.get("role") == "img"
    assert root.get("aria-labelledby") == "ampgraph-title ampgraph-desc"
    assert [child.tag for child in root][:2] == [f"{SVG}title", f"{SVG}desc"]
    assert root[0].text == "t & t" and root[1].text == "a <b> c"


@needs_dot
def test_rendered_svg_describes_the_figure() -> None:
    root = ET.fromstring(render_svg(opt_report()).encode())
    title, desc = root[0], root[1]
    assert title.text == "opt-125m — amp-fp32: autocast cuda bf16, parameters fp32"
    assert desc.text is not None
    assert "model.decoder.layers.0–11 are 12 identical layers drawn once" in desc.text
    assert "194 autocast casts and 24 type promotions" in desc.text
