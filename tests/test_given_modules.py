"""A leaf module that calls modules it is given (peft's DoRA: the magnitude layer, a module with
one parameter, is called with ``lora_A`` and ``lora_B`` and calls them): its hook fires as it
returns, after theirs, so the seed notebook's lines list it after them, where the graph's order
(its own first node, the weight norm, comes first) listed it before them (the zoo's peft/dora,
"not exact")."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ampgraph import analyze
from ampgraph.model.build import ModelInputs
from ampgraph.report.printed import hook_lines
from ampgraph.settings import Setting
from ampgraph.verify import verify
from ampgraph.verify.hooks import eager_hook_lines


class Magnitude(nn.Module):
    """DoRA's magnitude layer in small: a norm of its own weight, then the given modules."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor, lora_a: nn.Module, lora_b: nn.Module) -> torch.Tensor:
        scale = self.weight / self.weight.norm()
        return lora_b(lora_a(x)) * scale


class Adapter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(4, 4)
        self.lora_a = nn.Linear(4, 2, bias=False)
        self.lora_b = nn.Linear(2, 4, bias=False)
        self.magnitude = Magnitude()
        self.out = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.base.weight.dtype)
        return self.out(self.base(x) + self.magnitude(x, self.lora_a, self.lora_b))


def _adapter() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("adapter", Adapter().eval(), (torch.randn(3, 4),))


@pytest.mark.parametrize("name", ["fp32", "half", "amp-half", "amp-fp32"])
def test_a_leaf_that_calls_given_modules_prints_after_them(name: str) -> None:
    model, setting = _adapter(), Setting.parse(name)
    report = analyze(model, setting)
    lines = hook_lines(report)
    assert [line.split("]")[0][1:] for line in lines] == [
        "base", "lora_a", "lora_b", "magnitude", "out",
    ]  # fmt: skip
    assert lines == eager_hook_lines(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0
    result = verify(model, Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements
