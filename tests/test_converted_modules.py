"""Issue 42, mechanism 3: a module the forward converts itself, followed as a real run does.

SwitchTransformers' router runs ``self.classifier = self.classifier.to(self.dtype)`` in its
forward (fp32 routing, "selective precision"). On fake parameters ``Module._apply`` swaps each
parameter for its converted copy in place, which a fake tensor refuses (``_apply(): Couldn't
swap Linear.weight``), and the whole model was lost. A real run converts the parameters and goes
on; the capture and the eager oracle now do the same (:func:`ampgraph.torchutil.swapped_tensors`).
"""

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

SETTINGS = [
    (n, d) for n in ("fp32", "half", "amp-half", "amp-fp32") for d in ("bfloat16", "float16")
]


class Router(nn.Module):
    """Routes in fp32 whatever the model's dtype, converting its classifier on each call."""

    def __init__(self) -> None:
        super().__init__()
        self.classifier = nn.Linear(8, 4)
        self.dtype = torch.float32

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        self.classifier = self.classifier.to(self.dtype)
        return torch.softmax(self.classifier(h.to(self.dtype)), -1)


class Routed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.router = Router()
        self.out = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = self.router(self.proj(x.to(self.proj.weight.dtype)))
        return self.out(probs.to(self.out.weight.dtype))


def _model() -> ModelInputs:
    torch.manual_seed(0)
    return ModelInputs("converts", Routed().eval(), (torch.randn(3, 8),))


@pytest.mark.parametrize(("name", "dtype"), SETTINGS)
def test_a_module_converted_in_the_forward_is_followed(name: str, dtype: str) -> None:
    setting = Setting.parse(name, amp_dtype=dtype)
    model = _model()
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0
    lines = hook_lines(report)
    assert lines == eager_hook_lines(model, setting)
    routed = "float32" if name in ("fp32", "half") else dtype  # autocast lowers the Linear
    assert f"[router.classifier] in=torch.float32 -> out=torch.{routed}" in lines
    # The user's module is as it was: its parameters, their dtype and their type.
    assert model.module.router.classifier.weight.dtype == torch.float32
    assert type(model.module.router.classifier.weight) is nn.Parameter


@pytest.mark.parametrize("name", ["half", "amp-half"])
def test_the_real_cpu_run_agrees(name: str) -> None:
    result = verify(_model(), Setting.parse(name, device_type="cpu"))
    assert result.ok, result.disagreements


def test_switch_transformers_router_converts_its_classifier() -> None:
    """The transformers module that does it, from its tests' tiny sizes."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.switch_transformers import modeling_switch_transformers as st

    config = transformers.SwitchTransformersConfig(
        d_model=32, num_experts=4, expert_capacity=8, router_dtype="float32"
    )
    router = st.SwitchTransformersTop1Router(config).eval()
    model = ModelInputs("switch-router", router, (torch.randn(1, 5, 32),))
    setting = Setting.parse("half")
    report = analyze(model, setting)
    assert report.check is not None and report.check["disagreements"] == 0
    assert hook_lines(report) == eager_hook_lines(model, setting)
    assert hook_lines(report)[0] == "[classifier] in=torch.float32 -> out=torch.float32"
