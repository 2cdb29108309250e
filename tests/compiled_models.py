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


class Fp32Region(nn.Module):
    """A Linear under autocast, then one with autocast turned off inside the forward (an fp32
    region, as in a loss head or a router): its backward's matmuls are fp32 in eager's AMP recipe
    (``backward()`` outside the context) and 16-bit where the backward is traced in the forward's
    autocast (``backward_pass_autocast="same_as_forward"``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        with torch.autocast("cpu", enabled=False):
            return self.b(h.float())


def fp32_region() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Fp32Region(), torch.randn(32, 64)
