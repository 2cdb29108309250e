"""The make-fx capture (the default) gives torch.export's graph: each feature of export's own
passes on a module made for it, then bundled models, node for node, with the check's full record.

The whole matrix (every bundled model and the vision models, four settings, both dtypes) is
``scripts/engine_matrix.py`` (docs/capture-engines.md)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampgraph.capture.reads import annotation_difference
from ampgraph.capture.trace import EXPORT, MAKE_FX, capture
from ampgraph.model.build import ModelInputs, load_model
from ampgraph.pipeline.stages import analyze_capture, trace
from ampgraph.report.records import Report
from ampgraph.settings import Setting

from .test_fidelity import BiasedConv
from .test_tracers import run


class Everything(nn.Module):
    """A module called twice, a buffer, a scalar constant, an autocast-disabled region, a
    no-grad region, tied parameters, and nested inputs and outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.lin = nn.Linear(8, 8)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.emb.weight
        self.norm = nn.LayerNorm(8)
        self.register_buffer("scale", torch.ones(8))

    def forward(self, ids: torch.Tensor, extra: list[torch.Tensor]) -> dict[str, object]:
        h = self.emb(ids)
        h = self.lin(self.lin(h)) * self.scale + torch.tensor(2.0)
        with torch.autocast("cuda", enabled=False):
            h = self.norm(h.float())
        with torch.no_grad():
            k = extra[0] * 3
        return {"logits": self.head(h), "aux": (k, h.sum())}


class MaskIndex(nn.Module):
    """An op whose output size depends on the data: traced with an unbacked size."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        picked = x[x[:, 0] > 0]
        return self.lin(picked).sum(0)


def _both(model: ModelInputs, setting: str) -> dict[str, Report]:
    resolved = Setting.parse(setting)
    return {
        engine: analyze_capture(capture(trace(model, engine), resolved), check=True)
        for engine in (MAKE_FX, EXPORT)
    }


def assert_same(reports: dict[str, Report]) -> None:
    mine, theirs = reports[MAKE_FX], reports[EXPORT]
    assert mine.capture["method"].replace(MAKE_FX, EXPORT) == theirs.capture["method"]
    assert annotation_difference(mine, theirs) is None
    # The check's whole record too: the dtypes each trace recorded are its second oracle.
    assert [r.check for r in mine.nodes] == [r.check for r in theirs.nodes]
    other = [{k: v for k, v in r.capture.items() if k != "method"} for r in (mine, theirs)]
    assert other[0] == other[1]
    assert mine.check is not None and mine.check["disagreements"] == 0


@pytest.mark.parametrize("setting", ["fp32", "half", "amp-half", "amp-fp32"])
def test_every_export_pass_on_a_module_made_for_it(setting: str) -> None:
    model = ModelInputs(
        "everything", Everything(), (torch.zeros(2, 3, dtype=torch.long), [torch.randn(4)])
    )
    reports = _both(model, setting)
    assert_same(reports)
    report = reports[MAKE_FX]
    names = [n.name for n in report.nodes]
    # Export's placeholder names, tied alias, buffer and lifted constant included.
    assert names[:7] == [
        "p_emb_weight", "p_lin_weight", "p_lin_bias", "p_head_weight", "p_norm_weight",
        "p_norm_bias", "b_scale",
    ]  # fmt: skip
    assert {"c_lifted_tensor_0", "ids", "extra_0"} <= set(names)
    assert [n.kind for n in report.nodes].count("region") == 1
    # The module called twice is two calls, keyed as export keys them.
    calls = {n.module_call for n in report.nodes if n.module == "lin"}
    assert calls == {"L__self__lin", "L__self__lin@1"}


@pytest.mark.parametrize("setting", ["half", "amp-fp32"])
def test_a_data_dependent_size(setting: str) -> None:
    assert_same(_both(ModelInputs("mask", MaskIndex(), (torch.randn(6, 4),)), setting))


def test_a_model_that_raises_in_its_setting_is_traced_again() -> None:
    """``half`` with an fp32 input raises at the conv while tracing: both engines trace on past
    the raise in the setting's own dtypes (issue 25) and report the error at that node."""
    model = ModelInputs("conv", BiasedConv(), (torch.randn(1, 3, 8, 8),))
    reports = _both(model, "half")
    assert {name: r.capture["method"] for name, r in reports.items()} == {
        MAKE_FX: MAKE_FX,
        EXPORT: EXPORT,
    }
    assert_same(reports)
    assert [r.op for r in reports[MAKE_FX].nodes if r.error] == ["aten.conv2d.default"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "setting"), [("opt-125m", "amp-fp32"), ("llama-tiny", "amp-half")]
)
def test_bundled_models_node_for_node(name: str, setting: str) -> None:
    assert_same(_both(load_model(name), setting))


def test_the_default_and_the_option() -> None:
    model = ModelInputs("lin", nn.Linear(4, 4), (torch.randn(2, 4),))
    assert capture(model, Setting.parse("amp-fp32")).method == MAKE_FX
    assert capture(trace(model, "export"), Setting.parse("amp-fp32")).method == EXPORT
    code, out = run(
        "table", "--tracer", "export", "llama-tiny", "-s", "amp-fp32", "--format", "json"
    )
    assert code == 0 and '"method": "export"' in out
    code, out = run("table", "--help")
    assert code == 0 and "make-fx" in out
