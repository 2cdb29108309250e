"""Models that compile themselves (specs ``tests.self_compiled_models:NAME``): a submodule wrapped
in ``torch.compile`` inside the model, ``flex_attention``, a ``torch.compiler.disable`` region."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.attention.flex_attention import flex_attention


class InnerCompiled(nn.Module):
    """A Linear, then a submodule the model compiles itself (``torch.compile(module)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.block = torch.compile(nn.Sequential(nn.Linear(64, 64), nn.GELU()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        return self.block(y) * 1.7 + y


@torch.compiler.disable
def _eager_gelu_chain(y: torch.Tensor) -> torch.Tensor:
    return nn.functional.gelu(y) * 1.7 + y


class DisabledRegion(nn.Module):
    """Two Linears around a ``torch.compiler.disable`` function: under ``torch.compile`` a graph
    break, two compiled graphs and an eager region between them."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 64)
        self.b = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.b(_eager_gelu_chain(self.a(x))), dim=-1)


class FlexAttention(nn.Module):
    """Projections around ``flex_attention`` with a score modification; ``upcast``: q, k, v
    made fp32 first (autocast's kernel for the op casts them to 16 bits again)."""

    def __init__(self, upcast: bool = False) -> None:
        super().__init__()
        self.upcast = upcast
        self.qkv = nn.Linear(64, 3 * 64)
        self.out = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 16).permute(2, 0, 3, 1, 4)
        if self.upcast:
            q, k, v = q.float(), k.float(), v.float()
        o = flex_attention(q, k, v, score_mod=lambda s, bi, h, qi, ki: s + (qi - ki) * 0.01)
        return self.out(o.transpose(1, 2).reshape(b, t, 64))


def inner_compiled() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return InnerCompiled().eval(), torch.randn(32, 64)


def disabled_region() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return DisabledRegion().eval(), torch.randn(32, 64)


def flex() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return FlexAttention().eval(), torch.randn(2, 16, 64)


def flex_fp32() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return FlexAttention(upcast=True).eval(), torch.randn(2, 16, 64)
