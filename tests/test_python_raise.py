"""A Python-level raise in one setting, and a forward that raises on export's path only (issue 33).

``nn.GRU`` checks in Python that its input and weights have one dtype: the ``half`` setting of a
model fed fp32 raises ``ValueError`` there, before any op runs, and the other settings run. That
raise is the ``half`` setting's finding, at the GRU, as a kernel's dtype error is; the other
settings are analysed as usual. transformers' Informer and Autoformer build an attention mask under
export that a real run skips, and raise on it: the capture takes the real run's path.
Each is compared with a real CPU run (eager, hooks).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampgraph import analyze
from ampgraph.model.build import ModelInputs
from ampgraph.pipeline.stages import analyze_group
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify import verify

#: What nn.GRU raises in the half setting (its Python check), as a real run raises it.
GRU_ERROR = "RNN input dtype (torch.float32) does not match weight dtype (torch.bfloat16)."


class GRUNet(nn.Module):
    """A GRU fed fp32, with modules after it that a raise at the GRU leaves not run."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(8, 8, batch_first=True)
        self.head = nn.Linear(8, 4)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(x)
        return self.act(self.head(h))


class Checked(nn.Module):
    """A non-leaf module whose own code raises (not a leaf's): a real run's hooks print the
    error at the top level."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if y.dtype != x.dtype:
            raise TypeError(f"fc changed the dtype: {x.dtype} -> {y.dtype}")
        return self.out(y)


def _gru() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("gru", GRUNet(), (torch.randn(2, 5, 8),))


def test_a_python_raise_is_that_settings_error_at_the_module_that_raises() -> None:
    reports = analyze_group(_gru(), ["fp32", "half", "amp-fp32"])
    lines = {r.setting["name"]: hook_lines(r) for r in reports}
    assert lines["half"][-1].startswith("[gru] in=torch.float32 -> error: RNN input dtype")
    assert len(lines["half"]) == 1  # the forward ends there, as a real run ends
    raised = [n for n in reports[1].nodes if n.error]
    assert [n.op for n in raised] == ["ampgraph.raises.default"]
    assert raised[0].module == "gru" and raised[0].error.startswith(GRU_ERROR)
    # The modules after it are in the graph, not run (the diagrams and JSON show them so).
    half = reports[1]
    assert [m.path for m in half.modules] == ["gru", "head", "act"]
    assert all(half.node(n).skipped for m in half.modules[1:] for n in m.nodes)
    # Predicted, checked (the dispatcher replay raises it too), never a disagreement.
    assert half.check["disagreements"] == 0
    for name in ("fp32", "amp-fp32"):  # the other settings, analysed as usual
        assert [line.split("]")[0] for line in lines[name]] == ["[gru", "[head", "[act"]
        assert not any("error" in line for line in lines[name])


@pytest.mark.parametrize("name", ["fp32", "half", "amp-fp32"])
def test_a_python_raise_agrees_with_a_real_cpu_run(name: str) -> None:
    result = verify(_gru(), Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements
    # Every module compared, those after the raise as not run on both sides.
    assert (result.modules.agree, result.modules.total) == (3, 3)
    if name == "half":
        assert result.eager_hooks == [f"[gru] in=torch.float32 -> error: {GRU_ERROR}"
                                      " Convert input: input.to(torch.bfloat16), or convert "
                                      "model: model.to(torch.float32)"]


def test_a_raise_in_a_non_leaf_modules_own_code_is_printed_at_the_top_level() -> None:
    torch.manual_seed(0)
    model = ModelInputs("checked", Checked(), (torch.randn(2, 8),))
    report = analyze(model, "amp-fp32")
    assert hook_lines(report) == [
        "[fc] in=torch.float32 -> out=torch.bfloat16",
        "[(top level)] in=None -> error: fc changed the dtype: torch.float32 -> torch.bfloat16",
    ]
    assert report.check["disagreements"] == 0
    assert verify(model, Setting.parse("amp-fp32", device_type="cpu")).ok
    # Raised in every setting where fc changes the dtype; fp32 runs through.
    assert [line.split("]")[0] for line in hook_lines(analyze(model, "fp32"))] == ["[fc", "[out"]


def test_a_raise_in_every_setting_is_still_a_capture_error() -> None:
    """Inputs the model never accepts are the user's to fix, not any setting's finding."""
    from ampgraph.errors import CaptureError

    model = ModelInputs("gru-bad", GRUNet(), (torch.randn(2, 5, 3),))
    with pytest.raises(CaptureError, match="input.size"):
        analyze(model, "amp-fp32", check=False)


class ExportMask(nn.Module):
    """transformers' mask builders in small: under export (``torch.compiler.is_exporting()``)
    a mask of the input's length is built, which a real run skips when nothing is padded; a
    pooling layer halves the length, and the attention's own check raises on that mask."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.pool = nn.MaxPool1d(2)
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = None
        if torch.compiler.is_exporting():
            mask = torch.zeros(x.shape[0], x.shape[1], x.shape[1])
        h = self.pool(self.q(x).transpose(1, 2)).transpose(1, 2)
        scores = h @ h.transpose(1, 2)
        if mask is not None:
            if mask.shape != scores.shape:
                raise ValueError(
                    f"Attention mask should be of size {tuple(scores.shape)}, but is {mask.shape}"
                )
            scores = scores + mask
        return self.out(scores.softmax(-1) @ h)


def _export_mask() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("export-mask", ExportMask(), (torch.randn(2, 8, 8),))


@pytest.mark.parametrize("name", ["fp32", "half", "amp-fp32"])
def test_a_forward_that_raises_on_exports_path_only_is_traced_as_a_real_run(name: str) -> None:
    report = analyze(_export_mask(), name)
    assert "Attention mask should be of size" in report.capture["real_run"]
    assert report.check["disagreements"] == 0
    lines = hook_lines(report)
    if name == "half":  # fp32 input, bf16 weights: the first Linear's kernel error, as on a GPU
        assert len(lines) == 1 and "error: mat1 and mat2" in lines[0]
    else:
        assert [line.split("]")[0] for line in lines] == ["[q", "[pool", "[out"]
    assert verify(_export_mask(), Setting.parse(name, device_type="cpu")).ok


def test_a_graph_traced_as_a_real_run_serves_only_its_own_setting() -> None:
    fp32, amp = analyze_group(_export_mask(), ["fp32", "amp-fp32"], check=False)
    assert "graph_of" not in amp.capture and amp.capture["real_run"]


def test_informer_traced_as_a_real_run_agrees_with_a_real_cpu_run() -> None:
    """transformers' Informer (ProbSparse attention, distilling convolutions that halve the
    length): under export its encoder built a mask of the input's length and raised on it, so
    it was traced as a real run; with the example inputs' values followed (the all-ones
    observed mask), the capture takes the real run's path and needs no such trace."""
    transformers = pytest.importorskip("transformers")
    config = transformers.InformerConfig(
        prediction_length=4, context_length=8, lags_sequence=[1], num_time_features=1,
        d_model=8, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=8, decoder_ffn_dim=8,
    )  # fmt: skip
    torch.manual_seed(0)
    batch, past = 2, config.context_length + max(config.lags_sequence)
    inputs = {
        "past_values": torch.randn(batch, past),
        "past_time_features": torch.randn(batch, past, 1),
        "past_observed_mask": torch.ones(batch, past),
        "future_values": torch.randn(batch, config.prediction_length),
        "future_time_features": torch.randn(batch, config.prediction_length, 1),
    }
    model = ModelInputs("informer", transformers.InformerModel(config).eval(), (), inputs)
    setting = Setting.parse("amp-fp32", device_type="cpu")
    result = verify(model, setting)
    assert result.ok, result.disagreements
    assert result.report is not None
    assert "real_run" not in result.report.capture
