"""The backward diagram (``--pass backward``): gradients from the loss to the parameters, and the
panel of memory saved for backward.

Golden files live in ``tests/golden`` like the forward's; ``AMPGRAPH_UPDATE_GOLDEN=1 pytest
tests/test_render_backward.py`` rewrites them after an intended change -- review the diff.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest

from ampgraph.errors import RenderError
from ampgraph.render import build_graph, to_dot
from ampgraph.render.files import diagram_stem
from ampgraph.render.legend import memory_label
from ampgraph.render.style import THEMES
from ampgraph.report.records import Report
from tests.test_render import check_golden, opt_report

needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz's dot is not installed"
)


@functools.cache
def small_backward_report() -> Report:
    """Two Linears around a ReLU, in a list (so the panel has numbered layers), amp-fp32."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from ampgraph import analyze

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    return analyze(mlp, "amp-fp32", args=(torch.randn(2, 4),), pass_="backward", check=False)


@functools.cache
def opt_backward_report() -> Report:
    """OPT-125M's backward under amp-fp32, analysed here (about ten seconds, no dispatcher)."""
    pytest.importorskip("torch")
    from ampgraph import analyze, load_model

    model = load_model("opt-125m")
    return analyze(model, "amp-fp32", pass_="backward", check=False)


def test_golden_small_model_backward() -> None:
    check_golden(
        "small-mlp-amp-fp32.backward.dot", to_dot(small_backward_report(), pass_="backward")
    )


def test_small_backward_boxes_name_their_forward_module() -> None:
    graph = build_graph(small_backward_report(), pass_="backward")
    modules = {d["title"] for _, d in graph.nodes(data=True) if d["kind"] == "module"}
    assert modules == {"backward of 0", "backward of 1", "backward of 2"}
    # The loss is the one input; each parameter's gradient is an output, in fp32 (the parameter's
    # dtype), reached from its Linear, whose backward matmuls run in bf16.
    kinds = [d["kind"] for _, d in graph.nodes(data=True)]
    assert kinds.count("input") == 1
    grads = {d["title"]: d for _, d in graph.nodes(data=True) if d["kind"] == "output"}
    assert sorted(grads) == ["0.bias.grad", "0.weight.grad", "2.bias.grad", "2.weight.grad"]
    for node, data in graph.nodes(data=True):
        if data["kind"] == "output":
            assert [key for _, _, key in graph.in_edges(node, keys=True)] == ["float32"]
    linear = next(d for _, d in graph.nodes(data=True) if d["title"] == "backward of 2")
    assert dict(linear["matmuls"]) == {"mm": 2}
    assert ("weight grad", "bfloat16", "float32") in linear["casts"]


def test_golden_memory_panel() -> None:
    rows = [
        ("model.embed", {"int64": 64}),
        ("model.layers.0", {"float32": 3 * 2**20, "bfloat16": 2**20}),
        ("model.layers.1", {"float32": 3 * 2**20, "bfloat16": 2**20}),
        ("model.layers.2", {"float32": 3 * 2**20, "bfloat16": 2**20}),
        ("model.layers.3", {"float32": 2**20}),
        ("lm_head", {"bfloat16": 1536}),
    ]
    panel = memory_label(rows, THEMES["light"])
    check_golden("memory-panel.label", panel + "\n")
    # Identical neighbours share a row, the one that differs keeps its own; totals add all rows.
    assert "model.layers.0–2, each" in panel and "model.layers.3<" in panel
    assert "<B>10.0 MiB</B>" in panel


def test_forward_report_has_no_backward_to_draw() -> None:
    with pytest.raises(RenderError, match="--pass backward"):
        build_graph(opt_report(), pass_="backward")


def test_backward_files_sit_beside_the_forward() -> None:
    report = opt_report()
    assert diagram_stem(report, view="modules", fold=True, theme="dark", pass_="backward") == (
        "opt-125m-cuda-bf16-amp-fp32-backward-dark"
    )


def test_opt_125m_backward_structure() -> None:
    report = opt_backward_report()
    assert report.backward is not None
    unfolded = build_graph(report, pass_="backward", fold=False)
    sinks = [d for _, d in unfolded.nodes(data=True) if d["kind"] == "output"]
    trainable = [g for g in report.backward.gradients if g.node is not None]
    assert len(sinks) == len(trainable) == 196
    grad_dtype = {}
    for node, data in unfolded.nodes(data=True):
        if data["kind"] == "output":
            (key,) = [k for _, _, k in unfolded.in_edges(node, keys=True)]
            grad_dtype[data["members"][0].removeprefix("grad.")] = key
    # Under amp-fp32 every gradient is fp32 (the parameter's dtype), cast back from bf16 in
    # the Linears, whose backward matmuls run in bf16.
    assert grad_dtype["model.decoder.layers.3.fc1.weight"] == "float32"
    assert grad_dtype["model.decoder.embed_tokens.weight"] == "float32"
    assert set(grad_dtype.values()) == {"float32"}
    fc1 = unfolded.nodes["module/model.decoder.layers.3.fc1"]
    assert fc1["title"] == "backward of fc1"  # in the frame of layers.3
    assert dict(fc1["matmuls"]) == {"mm": 2}
    assert ("weight grad", "bfloat16", "float32") in fc1["casts"]
    bf16_edges = [k for _, _, k in unfolded.edges(keys=True) if k == "bfloat16"]
    assert bf16_edges
    # Folded: the twelve decoder layers are drawn once, with one set of gradients.
    folded = build_graph(report, pass_="backward")
    assert folded.graph["clusters"]["fold/model.decoder.layers.0"]["count"] == 12
    layers = dict(folded.graph["memory"])
    assert layers["model.decoder.layers.0"] == layers["model.decoder.layers.11"]


@needs_dot
def test_opt_125m_backward_svg_keeps_ids_and_tooltips() -> None:
    from ampgraph.render import render_svg

    svg = render_svg(opt_backward_report(), pass_="backward", theme="dark")
    assert 'id="module/model.decoder.layers.0.fc1"' in svg
    assert 'id="input/loss"' in svg and 'id="memory"' in svg
    assert "xlink:title" in svg


@needs_dot
def test_cli_render_pass_train_writes_both_diagrams(tmp_path: Path) -> None:
    """``render --pass train --report`` draws the forward and, beside it, the backward."""
    from click.testing import CliRunner

    from ampgraph.cli import main

    saved = tmp_path / "r.json"
    saved.write_text(small_backward_report().to_json(), encoding="utf-8")
    out = tmp_path / "out"
    args = ["render", "--report", str(saved), "--pass", "train", "--format", "svg", "--out"]
    result = CliRunner().invoke(main, [*args, str(out)])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "Sequential-cuda-bf16-amp-fp32-backward.svg",
        "Sequential-cuda-bf16-amp-fp32.svg",
    ]
    assert "saved for backward" in (out / names[0]).read_text(encoding="utf-8")
    # --loss belongs to an analysis, which a saved report has had already.
    refused = CliRunner().invoke(main, [*args, str(out), "--loss", "0"])
    assert refused.exit_code == 2 and "not --report" in refused.output


def test_backward_in_autocast_fills_boxes_by_policy() -> None:
    """With backward inside the autocast context its ops have autocast's policies, and the boxes
    are filled by them as in the forward; a cast that only feeds a gradient is not named by it."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from ampgraph import analyze

    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    report = analyze(
        mlp,
        "amp-fp32",
        args=(torch.randn(2, 4),),
        pass_="backward",
        check=False,
        backward_autocast=True,
    )
    graph = build_graph(report, pass_="backward")
    linear = graph.nodes["module/2"]
    assert linear["policy"] == "lower_precision_fp"
    assert linear["casts"][0] == ("grad", "float32", "bfloat16")
    assert ("bias grad", "bfloat16", "float32") in linear["casts"]
