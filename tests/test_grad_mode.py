"""The forward analysed as users run it for inference, ``--pass train`` as they train (issue 33).

A forward that writes with ``out=`` into a tensor runs under ``torch.no_grad()`` (as the seed
notebook runs models) and raises with gradients on, where the parameters require grad
(``functions with out=... arguments don't support automatic differentiation``). The forward pass
is analysed as inference runs it; a training step, which raises there too, says so in one line.
Both are compared with the real CPU model.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampgraph import analyze
from ampgraph.errors import CaptureError
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify import verify


class OutInto(nn.Module):
    """A Linear's output scaled into a buffer of its own with ``out=``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        buf = torch.empty_like(h)
        torch.mul(h, 2.0, out=buf)
        return self.head(buf)


def _model() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("out-into", OutInto(), (torch.randn(2, 5, 8),))


def test_the_real_model_runs_only_without_gradients() -> None:
    """What the analysis must follow: the real CPU model, with and without gradients."""
    model = _model()
    with torch.no_grad():
        model.module(*model.args)
    with pytest.raises(RuntimeError, match=r"mul\(\): functions with out=\.\.\. arguments"):
        model.module(*model.args)


@pytest.mark.parametrize("name", ["fp32", "half", "amp-fp32"])
def test_the_forward_is_analysed_as_inference_runs_it(name: str) -> None:
    report = analyze(_model(), name)
    assert report.check is not None and report.check["disagreements"] == 0
    lines = hook_lines(report)
    if name == "half":  # fp32 input, bf16 weights: the first Linear raises, as on a GPU
        assert len(lines) == 1 and "error: mat1 and mat2" in lines[0]
    else:
        out = "bfloat16" if name == "amp-fp32" else "float32"
        assert lines[-1] == f"[head] in=torch.{out} -> out=torch.{out}"
    result = verify(_model(), Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements


def test_a_training_step_reports_the_real_error_in_one_line() -> None:
    with pytest.raises(CaptureError) as raised:
        analyze(_model(), "amp-fp32", pass_="train")
    message = str(raised.value)
    assert "\n" not in message
    assert "mul(): functions with out=... arguments don't support automatic" in message
