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
from ampgraph.report.text import hook_lines
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
    # Predicted, checked (the dispatcher replay raises it too), never a disagreement.
    assert reports[1].check["disagreements"] == 0
    for name in ("fp32", "amp-fp32"):  # the other settings, analysed as usual
        assert [line.split("]")[0] for line in lines[name]] == ["[gru", "[head", "[act"]
        assert not any("error" in line for line in lines[name])


@pytest.mark.parametrize("name", ["fp32", "half", "amp-fp32"])
def test_a_python_raise_agrees_with_a_real_cpu_run(name: str) -> None:
    result = verify(_gru(), Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements


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
