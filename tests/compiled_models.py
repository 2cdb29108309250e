"""Small models for the compiled-flow tests (specs ``tests.compiled_models:NAME``)."""

from __future__ import annotations

import torch
from torch import nn


class GeluChain(nn.Module):
    """DESIGN.md fact 22: a Linear, then ``gelu(y) * 1.7 + y``: one fused pointwise chain."""

    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.f(x)
        return nn.functional.gelu(y) * 1.7 + y


class MatmulSoftmax(nn.Module):
    """Extern kernels (two matmuls) around one pointwise op and a reduction (softmax)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.b(torch.relu(self.a(x))), dim=-1)


def gelu_chain() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return GeluChain().eval(), torch.randn(32, 64)


def matmul_softmax() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return MatmulSoftmax().eval(), torch.randn(32, 64)
