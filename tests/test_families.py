"""Exact on families nobody here tuned for (issue 25): each mechanism on a small model of its own.

Every expectation is the eager model's own forward hooks on fake tensors with the real autocast
kernels (:func:`ampgraph.verify.hooks.eager_hook_lines`), never a literal read off ampgraph.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ampgraph import analyze
from ampgraph.model.build import ModelInputs
from ampgraph.review.findings import audit
from ampgraph.settings import Setting

# The fidelity tests' comparison: checked by the dispatcher, equal to the eager run's hooks.
from .test_fidelity import SETTINGS, _agree


class Fp32Function(torch.autograd.Function):
    """Runs ``mod`` with autocast off on fp32 inputs (``custom_fwd(cast_inputs=torch.float32)``)."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(ctx: object, x: torch.Tensor, mod: nn.Module) -> torch.Tensor:
        return mod(x * 2)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class CustomFwd(nn.Module):
    """The Function's fp32 output meets the bf16 LayerNorm of ``amp-half``, which raises; the
    Linear before it reads ``x.to(weight.dtype)`` at trace time."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x.to(self.a.weight.dtype))
        return Fp32Function.apply(x, self.b)


@pytest.mark.parametrize("name", SETTINGS)
def test_a_custom_fwd_function_raising_keeps_the_settings_reads(name: str) -> None:
    """The LayerNorm raises inside custom_fwd's autocast-off region: the trace past the raise
    left its casts in that region's body, where they hid the error from annotator and check."""
    model = ModelInputs("custom-fwd", CustomFwd().eval(), (torch.randn(2, 8),))
    lines = _agree(model, Setting.parse(name))
    if name == "amp-half":
        assert lines[0] == "[a] in=torch.bfloat16 -> out=torch.bfloat16"
        assert lines[1].startswith("[b] in=torch.float32 -> error:")


class ConvThenNorm(nn.Module):
    """In ``half`` the conv runs in bf16 (``x.to(weight.dtype)``); its output made fp32 meets
    the bf16 LayerNorm, which raises there, not at the conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 3, padding=1)
        self.ln = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.conv(x.to(self.conv.weight.dtype)).float())


@pytest.mark.parametrize("name", SETTINGS)
def test_an_fp32_input_into_a_bf16_layernorm_raises_at_the_layernorm(name: str) -> None:
    model = ModelInputs("conv-norm", ConvThenNorm().eval(), (torch.randn(2, 4, 8),))
    lines = _agree(model, Setting.parse(name))
    if name == "half":
        assert lines[0] == "[conv] in=torch.bfloat16 -> out=torch.bfloat16"
        assert lines[1].startswith("[ln] in=torch.float32 -> error:")


class BCEHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(self.fc(x))
        return F.binary_cross_entropy(p, torch.ones_like(p))


@pytest.mark.parametrize("name", SETTINGS)
def test_binary_cross_entropy_under_autocast_is_the_top_level_raise(name: str) -> None:
    model = ModelInputs("bce", BCEHead().eval(), (torch.randn(2, 8),))
    lines = _agree(model, Setting.parse(name))
    if name.startswith("amp"):
        assert lines[-1].startswith("[(top level)] in=None -> error: torch.nn.functional.binary")


def test_the_banned_op_advice_is_not_autocast() -> None:
    model = ModelInputs("bce", BCEHead().eval(), (torch.randn(2, 8),))
    (finding,) = [
        f
        for f in audit(analyze(model, Setting.parse("amp-half")))
        if f.node.startswith("binary_cross_entropy")
    ]
    assert "binary_cross_entropy_with_logits" in finding.suggestion
    assert "enabled=False" in finding.suggestion
    assert "inside torch.autocast" not in finding.suggestion
