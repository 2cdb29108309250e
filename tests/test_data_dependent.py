"""Forwards that branch on data values (issue 10 class 7, issue 11 item 3).

Fake tensors have no values, so ``torch.export`` cannot decide ``if keep.numel() == 0``. ampgraph
traces such a forward along the path that seeded random values take (``draft-export``), says so,
and is checked against the dispatcher and against a real CPU run.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampgraph import analyze
from ampgraph.hooks import eager_hook_lines
from ampgraph.models import ModelInputs
from ampgraph.settings import Setting
from ampgraph.text import hook_lines


class KeepPositive(nn.Module):
    """A detector's shape of problem: filter by value, then branch on whether anything is left."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        keep = y[y > 0]
        if keep.numel() == 0:
            return self.head(x)
        return self.head(y) * keep.sum()


def _model() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("keep", KeepPositive(), (torch.randn(4, 8),))


@pytest.mark.parametrize("name", ["fp32", "half", "amp-half", "amp-fp32"])
def test_a_branch_on_data_is_traced_along_one_path_and_checked(name: str) -> None:
    model, setting = _model(), Setting.parse(name)
    report = analyze(model, setting)
    assert report.capture["method"] == "draft-export"
    assert isinstance(report.capture["data_dependent"], list)
    assert report.check is not None and report.check["disagreements"] == 0
    ours = hook_lines(report)
    eager = eager_hook_lines(model, setting)
    if name == "half":  # fp32 input, bf16 weights: both stop at fc, as a GPU does
        assert ours == eager and "error: mat1 and mat2" in ours[0]
        return
    # The eager oracle on fake tensors stops where the forward branches on data; up to there
    # the two agree, and it says the rest could not be followed, never that the model raised.
    assert eager[-1].startswith("[(top level)] in=None -> not analysed: ")
    assert ours[: len(eager) - 1] == eager[:-1] and len(ours) == len(eager)


def test_the_path_traced_agrees_with_a_real_cpu_run() -> None:
    from ampgraph.verify import verify

    for name in ("fp32", "amp-fp32", "amp-half"):
        result = verify(_model(), Setting.parse(name, device_type="cpu"))
        assert result.ok, result.disagreements
