"""A model that imports ``flex_attention`` inside its forward (spec
``tests.late_flex_models:late_flex``): this module imports nothing of flex's, so in a fresh process
the import first runs while the capture traces the model. ``tests/self_compiled_models.py``
imports it at the top, as most models do."""

from __future__ import annotations

import torch
from torch import nn


class LateFlex(nn.Module):
    """Projections around ``flex_attention`` with a score modification, imported when called."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(64, 3 * 64)
        self.out = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention.flex_attention import flex_attention

        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 16).permute(2, 0, 3, 1, 4)
        o = flex_attention(q, k, v, score_mod=lambda s, bi, h, qi, ki: s + (qi - ki) * 0.01)
        return self.out(o.transpose(1, 2).reshape(b, t, 64))


def late_flex() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return LateFlex().eval(), torch.randn(2, 8, 64)
