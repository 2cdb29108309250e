"""The renderer: Graphviz source (golden files), folding, highlights, files, determinism.

Most tests read ``tests/data/opt-125m-amp-fp32.json``, a compact OPT-125M report (made by
:func:`tests.render_fixtures.compact_report_json`; the slow test below checks it still matches a
fresh analysis), so they need neither torch nor seconds of tracing. Golden files live in
``tests/golden``; ``AMPGRAPH_UPDATE_GOLDEN=1 pytest tests/test_render.py`` rewrites them (and the
fixture) after an intended change -- review the diff before committing it.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampgraph.errors import RenderError
from ampgraph.notebook import report_svg
from ampgraph.render import build_graph, render_files, render_svg, to_dot
from ampgraph.render.files import MISSING_DOT, atomic_write, run_dot
from ampgraph.render.style import THEMES, dtype_colour
from ampgraph.report.records import Report

HERE = Path(__file__).parent
DATA = HERE / "data"
GOLDEN = HERE / "golden"
OPT_FIXTURE = DATA / "opt-125m-amp-fp32.json"
UPDATE = os.environ.get("AMPGRAPH_UPDATE_GOLDEN") == "1"

needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz's dot is not installed"
)


def opt_report() -> Report:
    return Report.from_json(OPT_FIXTURE.read_text())


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE or not path.exists():
        path.write_text(text, encoding="utf-8")
        if not UPDATE:
            pytest.fail(f"golden file {path} was missing and has been written: review it")
    assert text == path.read_text(encoding="utf-8"), (
        f"{name} changed; if intended, rerun with AMPGRAPH_UPDATE_GOLDEN=1 and review the diff"
    )


def node_block(source: str, needle: str) -> str:
    """The DOT statement of the node whose label contains ``needle``."""
    for line in source.splitlines():
        if needle in line and "label=<" in line and "->" not in line:
            return line
    raise AssertionError(f"no node labelled with {needle!r}")


# -- torch-free ------------------------------------------------------------------------------------


def test_renderer_never_imports_torch() -> None:
    code = (
        "import sys, ampgraph.render, ampgraph.render.files, ampgraph.render.graph; "
        "from ampgraph.report.records import Report; "
        f"ampgraph.render.to_dot(Report.from_json(open({str(OPT_FIXTURE)!r}).read())); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- golden Graphviz source ----------------------------------------------------------------------


def test_golden_opt_125m_folded_module_view() -> None:
    check_golden("opt-125m-amp-fp32.modules.dot", to_dot(opt_report()))


def test_golden_opt_125m_folded_op_view_dark() -> None:
    check_golden("opt-125m-amp-fp32.ops.dark.dot", to_dot(opt_report(), view="ops", theme="dark"))


# -- what the module view shows ------------------------------------------------------------------


def test_folded_opt_is_one_layer_marked_x12() -> None:
    graph = build_graph(opt_report())
    assert graph.number_of_nodes() <= 60
    folds = [c for c in graph.graph["clusters"].values() if c["kind"] == "fold"]
    assert folds == [
        {"kind": "fold", "id": "fold/model.decoder.layers.0", "path": "model.decoder.layers.0",
         "count": 12, "label": "model.decoder.layers.0–11"},
    ]  # fmt: skip
    titles = [d["title"] for _, d in graph.nodes(data=True)]
    # The seed's boxes, in its order, with names relative to the folded layer.
    for expected in (
        "input_ids", "model.decoder.embed_tokens", "model.decoder.embed_positions", "add",
        "self_attn_layer_norm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
        "attention (SDPA)", "self_attn.out_proj", "residual add", "final_layer_norm", "fc1",
        "activation_fn", "fc2", "model.decoder.final_layer_norm", "lm_head", "output",
    ):  # fmt: skip
        assert expected in titles
    assert titles.count("residual add") == 2
    source = to_dot(opt_report())
    assert "×12" in source


def test_unfold_draws_all_twelve_layers() -> None:
    graph = build_graph(opt_report(), fold=False)
    folds = [c for c in graph.graph["clusters"].values() if c["kind"] == "fold"]
    assert [c["label"] for c in folds] == [f"model.decoder.layers.{i}" for i in range(12)]
    assert all(c["count"] == 1 for c in folds)
    assert sum(d["title"] == "residual add" for _, d in graph.nodes(data=True)) == 24


def test_a_layer_that_differs_stays_visible() -> None:
    report = opt_report()
    for rec in report.nodes:
        if rec.module == "model.decoder.layers.5.fc1":
            # As if layer 5's fc1 got its input already in bf16: autocast casts only the params.
            rec.casts = [c for c in rec.casts if not c.node.startswith("layer_norm")]
    graph = build_graph(report)
    folds = sorted(
        (c["label"], c["count"]) for c in graph.graph["clusters"].values() if c["kind"] == "fold"
    )
    assert folds == [
        ("model.decoder.layers.0–4", 5),
        ("model.decoder.layers.5", 1),
        ("model.decoder.layers.6–11", 6),
    ]
    fc1 = {
        graph.nodes[n]["chain"][-1]: graph.nodes[n]
        for n in graph
        if graph.nodes[n]["title"] == "fc1"
    }
    odd = fc1["fold/model.decoder.layers.5"]
    assert odd["casts"] == (("weight", "float32", "bfloat16"), ("bias", "float32", "bfloat16"))
    # The boxes that differ point at each other; the rest of the layer is unmarked.
    assert odd["differs"] == ("layers.0–4", "layers.6–11")
    assert fc1["fold/model.decoder.layers.0"]["differs"] == ("layers.5",)
    assert [d["title"] for _, d in graph.nodes(data=True) if d["differs"]].count("fc1") == 3
    assert sum(bool(d["differs"]) for _, d in graph.nodes(data=True)) == 3
    assert "≠ unlike layers.0–4, layers.6–11" in to_dot(report)


def test_casts_are_written_in_each_box() -> None:
    source = to_dot(opt_report())
    q_proj = node_block(source, "self_attn.q_proj")
    assert "casts x, weight, bias: fp32→bf16" in q_proj
    assert "fp32 → bf16" in q_proj and "policy: lower precision" in q_proj
    out_proj = node_block(source, "self_attn.out_proj")
    assert "casts weight, bias: fp32→bf16" in out_proj  # its input is bf16 already


def test_promotions_are_highlighted() -> None:
    source = to_dot(opt_report())
    promotion = THEMES["light"].promotion
    residuals = [ln for ln in source.splitlines() if "residual add" in ln and "->" not in ln]
    assert len(residuals) == 2
    for line in residuals:
        assert "fp32 + bf16 → fp32" in line and "⚠ promotion to fp32" in line
        assert f'color="{promotion.border}"' in line and "penwidth=4" in line
    # The embedding sum (fp32 + fp32) is no promotion and is drawn plainly.
    embedding_sum = node_block(source, "<B>add</B>")
    assert "promotion" not in embedding_sum and "penwidth=4" not in embedding_sum


def test_edges_are_coloured_and_labelled_by_dtype() -> None:
    source = to_dot(opt_report())
    edges = [ln for ln in source.splitlines() if " -> " in ln and "invis" not in ln]
    assert edges
    for line in edges:
        label = re.search(r'label=" (\S+) "', line).group(1)
        dtype = {"fp32": "float32", "bf16": "bfloat16", "int64": "int64", "bool": "bool"}[label]
        assert f'color="{dtype_colour(dtype)}"' in line


def test_legend_and_title() -> None:
    source = to_dot(opt_report())
    assert "opt-125m — amp-fp32: autocast cuda bf16, parameters fp32" in source
    assert "edges: dtype" in source and "boxes: autocast policy" in source
    assert "342 ops, all agree" in source


def test_dark_theme_uses_its_background() -> None:
    assert f'bgcolor="{THEMES["dark"].background}"' in to_dot(opt_report(), theme="dark")


def test_op_view_draws_every_aten_node() -> None:
    report = opt_report()
    graph = build_graph(report, view="ops", fold=False)
    ops = [r for r in report.nodes if r.kind == "op"]
    assert sum(d["kind"] == "op" for _, d in graph.nodes(data=True)) == len(ops)


def test_bad_arguments_are_one_line_errors() -> None:
    with pytest.raises(RenderError, match="unknown view 'graph'"):
        to_dot(opt_report(), view="graph")
    with pytest.raises(RenderError, match="unknown theme"):
        to_dot(opt_report(), theme="sepia")
    with pytest.raises(RenderError, match="unknown format 'gif'"):
        render_files([opt_report()], "unused", formats=("gif",))


# -- files ---------------------------------------------------------------------------------------


def two_settings() -> list[Report]:
    """The fixture under two setting names: enough for an overview without a second analysis."""
    first = opt_report()
    second = copy.deepcopy(first)
    second.setting = {**second.setting, "name": "amp-half", "param_dtype": "bfloat16"}
    return [first, second]


def test_dot_format_needs_no_graphviz(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    paths = render_files(two_settings(), tmp_path / "out", formats=("dot",))
    assert [p.name for p in paths] == [
        "opt-125m-cuda-bf16-amp-fp32.dot",
        "opt-125m-cuda-bf16-amp-half.dot",
        "opt-125m-cuda-bf16-overview.dot",
    ]
    assert paths[0].read_text() == to_dot(opt_report())


def test_missing_dot_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(RenderError) as info:
        render_files([opt_report()], tmp_path / "out", formats=("svg",))
    message = str(info.value)
    assert message == MISSING_DOT and "\n" not in message
    assert "apt-get install graphviz" in message and "--format dot" in message
    assert not (tmp_path / "out").exists()  # failed before writing anything
    assert report_svg(opt_report()) is None  # a notebook falls back to the text repr


def test_atomic_write_leaves_no_temporary_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "figure.svg"
    atomic_write(target, b"old")

    def fail(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        atomic_write(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["figure.svg"]


def test_two_reports_of_one_setting_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RenderError, match="would both be written to opt-125m-cuda-bf16-amp-fp32"):
        render_files([opt_report(), opt_report()], tmp_path, formats=("dot",))


@needs_dot
def test_files_are_deterministic_and_complete(tmp_path: Path) -> None:
    formats = ("svg", "dot", "png", "pdf")
    first = render_files(two_settings(), tmp_path / "a", formats=formats)
    time.sleep(1.1)  # PDFs carry a creation time: make sure a second has passed
    second = render_files(two_settings(), tmp_path / "b", formats=formats)
    assert [p.name for p in first] == [p.name for p in second]
    assert len(first) == 12  # two settings and the overview, four formats each
    for a, b in zip(first, second):
        assert a.read_bytes() == b.read_bytes(), a.name
    # Nothing but the diagrams: no temporary files left behind.
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(p.name for p in first)


@needs_dot
def test_svg_is_byte_identical_and_a_notebook_shows_it() -> None:
    report = opt_report()
    svg = render_svg(report)
    assert svg == render_svg(report)
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert report_svg(report) == svg


@needs_dot
def test_default_diagrams_lay_out_quickly() -> None:
    for view in ("modules", "ops"):
        source = to_dot(opt_report(), view=view)
        start = time.perf_counter()
        run_dot(source, "svg")
        assert time.perf_counter() - start < 5.0


@needs_dot
def test_dot_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(RenderError, match="^Graphviz's dot failed to render svg") as info:
        run_dot("digraph { a -> }", "svg")
    assert "\n" not in str(info.value)


# -- a small model analysed here: the source golden, a region, a promotion -----------------------


def small_model_report() -> Report:
    torch = pytest.importorskip("torch")
    from torch import nn

    from ampgraph import analyze

    class Block(nn.Module):
        """LayerNorm, two Linears and a residual add (which promotes under amp-fp32), then an
        autocast-disabled region (seed 002's fp32 wrapper) and a softmax."""

        def __init__(self) -> None:
            super().__init__()
            self.ln = nn.LayerNorm(4)
            self.fc1 = nn.Linear(4, 8)
            self.act = nn.ReLU()
            self.fc2 = nn.Linear(8, 4)
            self.w = nn.Parameter(torch.randn(4, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.fc2(self.act(self.fc1(self.ln(x))))
            with torch.autocast("cuda", enabled=False):
                y = x.float() @ self.w.float().t()
            return torch.softmax(y, -1)

    return analyze(Block(), "amp-fp32", args=(torch.randn(2, 4),))


def test_golden_small_model_with_region_and_promotion() -> None:
    report = small_model_report()
    source = to_dot(report)
    check_golden("small-block-amp-fp32.modules.dot", source)
    graph = build_graph(report)
    regions = [c for c in graph.graph["clusters"].values() if c["kind"] == "region"]
    assert [r["label"] for r in regions] == ["autocast disabled"]
    nodes = sorted(graph.nodes(data=True), key=lambda nd: nd[1]["order"])
    inside = [d["title"] for _, d in nodes if any(c.startswith("region/") for c in d["chain"])]
    assert inside == ["matmul", "region output"]
    assert "subgraph cluster_region {" in source
    (promoted,) = [d for _, d in graph.nodes(data=True) if d["promotion"]]
    assert promoted["title"] == "residual add"


def test_a_region_inside_one_module_call_frames_that_box() -> None:
    """Seed 002's wrapper is a module whose forward is the region: its box is drawn inside the
    frame, with no separate region box (which would feed back into the call: a loop)."""
    import networkx as nx

    torch = pytest.importorskip("torch")
    from torch import nn

    from ampgraph import analyze

    class Fp32Linear(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cuda", enabled=False):
                return super().forward(x.float())

    net = nn.Sequential(nn.Linear(4, 4), Fp32Linear(4, 4), nn.Linear(4, 4))
    graph = build_graph(analyze(net, "amp-fp32", args=(torch.randn(2, 4),)))
    assert nx.is_directed_acyclic_graph(graph)
    assert not [n for n, d in graph.nodes(data=True) if d["kind"] == "region"]
    (region,) = [c for c in graph.graph["clusters"].values() if c["kind"] == "region"]
    assert region["label"] == "autocast disabled"
    framed = [d["title"] for _, d in graph.nodes(data=True) if any(
        c.startswith("region/") for c in d["chain"]
    )]  # fmt: skip
    assert framed == ["1"]
    assert [(d["title"], d["in_dtypes"], d["out_dtype"]) for _, d in graph.nodes(data=True)
            if d["kind"] == "module"] == [
        ("0", ("float32",), "bfloat16"),
        ("1", ("bfloat16",), "float32"),
        ("2", ("float32",), "bfloat16"),
    ]  # fmt: skip


# -- the committed fixture is what the analysis produces today -------------------------------


@pytest.mark.slow
def test_fixture_matches_a_fresh_analysis() -> None:
    from .conftest import report
    from .render_fixtures import compact_report_json

    fresh = report("opt-125m", "amp-fp32")
    if UPDATE:
        OPT_FIXTURE.write_text(compact_report_json(fresh), encoding="utf-8")
    assert to_dot(fresh) == to_dot(opt_report())


@pytest.mark.slow
@needs_dot
def test_four_settings_fold_small_and_lay_out_fast() -> None:
    from .conftest import report

    for setting in ("fp32", "half", "amp-half", "amp-fp32"):
        rep = report("opt-125m", setting)
        assert build_graph(rep).number_of_nodes() <= 60
        source = to_dot(rep)
        start = time.perf_counter()
        run_dot(source, "svg")
        assert time.perf_counter() - start < 5.0, setting


def test_casts_name_activations_by_role_where_several_meet() -> None:
    """Llama's attention gets q and k in fp32 (after RoPE promoted them) and v in bf16."""
    from ampgraph.report.records import Cast, NodeRecord

    def inp(name: str, dtype: str) -> NodeRecord:
        return NodeRecord(name, "placeholder", "input", target=name, outputs=[dtype])

    sdpa = NodeRecord(
        "sdpa",
        "aten.scaled_dot_product_attention.default",
        "op",
        inputs=[
            {"node": "q", "dtype": "float32"},
            {"node": "k", "dtype": "float32"},
            {"node": "v", "dtype": "bfloat16"},
        ],
        policy="lower_precision_fp",
        casts=[Cast("q", "float32", "bfloat16"), Cast("k", "float32", "bfloat16")],
        outputs=["bfloat16"],
    )
    out = NodeRecord("output", "output", "output", inputs=[{"node": "sdpa", "dtype": "bfloat16"}])
    setting = {"name": "amp-fp32", "device_type": "cuda", "autocast": True,
               "amp_dtype": "bfloat16", "param_dtype": "float32"}  # fmt: skip
    report = Report("hand-made", setting, {}, {}, [inp("q", "float32"), inp("k", "float32"),
                    inp("v", "bfloat16"), sdpa, out], [])  # fmt: skip
    graph = build_graph(report)
    assert graph.nodes["op/sdpa"]["casts"] == (
        ("q", "float32", "bfloat16"),
        ("k", "float32", "bfloat16"),
    )
    assert "casts q, k: fp32→bf16" in to_dot(report)
    assert sorted((u, v, k) for u, v, k in graph.edges(keys=True)) == [
        ("input/k", "op/sdpa", "float32"),
        ("input/q", "op/sdpa", "float32"),
        ("input/v", "op/sdpa", "bfloat16"),
        ("op/sdpa", "output/output", "bfloat16"),
    ]
