"""A two-block MLP with one outlier channel, as large language models grow them ("massive
activations"): ``blocks.0.fc1``'s row 7 is scaled by 50,000, so ``blocks.0.fc2``'s input carries
one channel in the thousands beside values near zero. One FP8 scale per tensor (torchao's
tensorwise recipe) sets the scale by that channel and flushes the small values to zero; one scale
per row keeps most of them. ``docs/fp8.md`` uses it:

    ampgraph fp8-ranges --module examples/fp8_outlier.py:build --recipe torchao:tensorwise --advise
"""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """Linear, GELU, Linear, with a residual."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(x)))


class OutlierMLP(nn.Module):
    """Two blocks and a head; block 0's fc1 makes one huge channel."""

    def __init__(self, width: int = 64, hidden: int = 128, classes: int = 32) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, hidden) for _ in range(2))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build() -> tuple[nn.Module, torch.Tensor]:
    """The model (seeded weights, channel 7 of block 0's hidden layer 50,000x) and its input."""
    gen = torch.Generator().manual_seed(0)
    model = OutlierMLP()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        model.blocks[0].fc1.weight[7] *= 50000.0
        model.blocks[0].fc1.bias[7] = 1000.0
    return model.eval(), torch.randn(32, 64, generator=gen)
