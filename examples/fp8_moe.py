"""A mixture-of-experts layer whose experts run as grouped GEMMs (``torch._grouped_mm``), as
torchtitan's MoE does, for torchao's MXFP8 MoE training recipe (``MXFP8TrainingOpConfig``):
a bf16 router picks one expert per token, the tokens are sorted by expert, and each expert's
SwiGLU-free MLP (``w1``, SiLU, ``w2``) runs on its group in two grouped GEMMs. Routing is
written without data-dependent shapes (a comparison against ``arange`` counts the tokens per
expert), so it traces on fake tensors. ``docs/fp8.md`` uses it:

    ampgraph fp8 --module examples/fp8_moe.py:build --recipe torchao:mxfp8_rceil,kernel=emulated --pass train
"""

from __future__ import annotations

import torch
from torch import nn


class GroupedExperts(nn.Module):
    """``experts`` MLPs, each ``dim -> hidden -> dim``, their weights stacked as 3-D tensors."""

    def __init__(self, experts: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(experts, dim, hidden))

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        # torchao's grouped GEMM takes B as (E, K, N): the weights transposed, as torchtitan does.
        h = torch._grouped_mm(x, self.w1.transpose(-2, -1), offs=offs)
        return torch._grouped_mm(nn.functional.silu(h), self.w2.transpose(-2, -1), offs=offs)


class MoE(nn.Module):
    """Top-1 routing over ``experts`` grouped experts, the output weighted by the gate."""

    def __init__(self, dim: int = 64, hidden: int = 128, experts: int = 4) -> None:
        super().__init__()
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = GroupedExperts(experts, dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gates = self.router(x).float().softmax(-1)
        weight, choice = gates.max(-1)
        order = choice.argsort(stable=True)
        counts = (choice.unsqueeze(-1) == torch.arange(gates.shape[-1])).sum(0)
        offs = counts.cumsum(0).to(torch.int32)
        y = self.experts(x[order], offs)
        # Back to the tokens' order (order's inverse), scaled by the gate's weight.
        return y[order.argsort()] * weight.unsqueeze(-1).to(y.dtype)


def build() -> tuple[nn.Module, torch.Tensor]:
    """The MoE with seeded weights and 64 tokens (a multiple of 32: MXFP8's weight-gradient
    GEMM scales along the tokens)."""
    gen = torch.Generator().manual_seed(0)
    model = MoE()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model, torch.randn(64, 64, generator=gen)
