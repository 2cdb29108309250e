"""Issue 42: ops that read a tensor's value (``.item()``) followed as a real run follows them.

A vision embedding reads its grid with ``.item()`` and splits its patches by the counts it read
(qwen2_5_vl's ``grid_thw[0].item()``). On fake tensors each read is a size without a value; the
capture carries it as one (an unbacked size), the annotation types every op past it, and the
eager oracle and the real CPU run agree line for line: no graph cut, nothing lost.
"""

from __future__ import annotations

import torch
from torch import nn

from ampgraph import analyze
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify import verify
from ampgraph.verify.hooks import eager_hook_lines


class GridSplit(nn.Module):
    """Embeds each image's patches, as many as its grid says, read with ``.item()``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, patches: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        outs, start = [], 0
        for t, h in grid:
            n = (t * h).item()
            part = self.proj(patches[start : start + n])
            outs.append(part.mean(0, keepdim=True).expand(h.item(), -1))
            start += n
        return self.out(torch.cat(outs))


def _model() -> ModelInputs:
    torch.manual_seed(0)
    grid = torch.tensor([[1, 4], [2, 3]])
    return ModelInputs("grid-split", GridSplit().eval(), (torch.randn(10, 4), grid))


def test_sizes_read_with_item_are_followed() -> None:
    model = _model()
    setting = Setting.parse("amp-fp32")
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0
    lines = hook_lines(report)
    unbacked = report.capture.get("unbacked_values") or None
    assert lines == eager_hook_lines(model, setting, unbacked)
    assert lines == [
        "[proj] in=torch.float32 -> out=torch.bfloat16",
        "[proj] in=torch.float32 -> out=torch.bfloat16",
        "[out] in=torch.bfloat16 -> out=torch.bfloat16",
    ]


def test_the_real_cpu_run_agrees() -> None:
    result = verify(_model(), Setting.parse("amp-fp32", device_type="cpu"))
    assert result.ok, result.disagreements
