"""Attention and checkpoint corners for the zoo's "beyond transformers" list (issue 42).

Small modules that call torch's attention and checkpointing entry points the way models do, in
the corners a library's own families may not reach: ``F.scaled_dot_product_attention`` with a
float or boolean ``attn_mask``, ``is_causal`` and ``enable_gqa``; ``nn.MultiheadAttention`` and
``nn.TransformerEncoderLayer`` (whose eval-mode fast path torch takes only outside autocast);
and ``torch.utils.checkpoint.checkpoint(use_reentrant=False)`` inside a forward. Widths follow
the zoo's: 2-4 heads of width 8. Each builder returns a ``ModelInputs`` as ``zoo_beyond``'s do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _t(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def _mi(name: str, module: nn.Module, *args: Any) -> Any:
    from ampgraph.model.build import ModelInputs

    return ModelInputs(name, module.eval(), args, {})


class SdpaBlock(nn.Module):
    """One attention layer by ``F.scaled_dot_product_attention``: ``mode`` picks the corner
    (``float-mask``: an additive float mask; ``bool-mask``: a boolean keep-mask; ``causal``:
    ``is_causal=True``; ``gqa``: fewer key/value heads than query heads, ``enable_gqa=True``)."""

    def __init__(self, mode: str, width: int = 32, heads: int = 4, kv_heads: int = 4) -> None:
        super().__init__()
        self.mode, self.heads, self.kv_heads, self.head = mode, heads, kv_heads, width // heads
        self.q = nn.Linear(width, width)
        self.kv = nn.Linear(width, 2 * kv_heads * self.head)
        self.out = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, _ = x.shape
        h = self.norm(x)
        q = self.q(h).view(b, n, self.heads, self.head).transpose(1, 2)
        k, v = self.kv(h).view(b, n, 2, self.kv_heads, self.head).permute(2, 0, 3, 1, 4)
        if self.mode == "causal":
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.mode == "gqa":
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return x + self.out(a.transpose(1, 2).reshape(b, n, -1))


class MhaBlock(nn.Module):
    """``nn.MultiheadAttention`` with a key padding mask, then a feed-forward."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(width, 64), nn.GELU(), nn.Linear(64, width))

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        a, _ = self.attn(x, x, x, key_padding_mask=padding, need_weights=False)
        return self.ff(x + a)


class Checkpointed(nn.Module):
    """Two attention blocks, each run under ``checkpoint(use_reentrant=False)`` as models do
    with gradient checkpointing on (which their forward keeps in eval mode, too)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([SdpaBlock("causal"), SdpaBlock("float-mask")])
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = torch.utils.checkpoint.checkpoint(self.blocks[0], x, use_reentrant=False)
        x = torch.utils.checkpoint.checkpoint(self.blocks[1], x, mask, use_reentrant=False)
        return self.head(x)


def _padding() -> torch.Tensor:
    return torch.tensor([[False] * 6 + [True] * 2, [False] * 8])


def _float_mask() -> torch.Tensor:
    return torch.zeros(2, 1, 8, 8).masked_fill(torch.ones(8, 8).triu(1).bool(), float("-inf"))


def _encoder() -> nn.Module:
    return nn.TransformerEncoder(
        nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=True), num_layers=2,
        enable_nested_tensor=False,
    )  # fmt: skip


#: name -> (family, builder)
CORNERS: dict[str, tuple[str, Callable[[], Any]]] = {
    "sdpa-float-mask": ("SDPA, additive float attn_mask", lambda: _mi(
        "corners/sdpa-float-mask", SdpaBlock("float-mask"), _t(2, 8, 32), _float_mask())),
    "sdpa-bool-mask": ("SDPA, boolean attn_mask", lambda: _mi(
        "corners/sdpa-bool-mask", SdpaBlock("bool-mask"), _t(2, 8, 32),
        ~_padding()[:, None, None, :])),
    "sdpa-causal": ("SDPA, is_causal", lambda: _mi(
        "corners/sdpa-causal", SdpaBlock("causal"), _t(2, 8, 32))),
    "sdpa-gqa": ("SDPA, enable_gqa (4 query heads, 2 key/value)", lambda: _mi(
        "corners/sdpa-gqa", SdpaBlock("gqa", kv_heads=2), _t(2, 8, 32))),
    "multihead-attention": ("nn.MultiheadAttention, key padding mask", lambda: _mi(
        "corners/multihead-attention", MhaBlock(), _t(2, 8, 32), _padding())),
    "transformer-encoder": ("nn.TransformerEncoder, key padding mask", lambda: _mi(
        "corners/transformer-encoder", _encoder(), _t(2, 8, 32), None, _padding())),
    "checkpoint": ("torch.utils.checkpoint, use_reentrant=False", lambda: _mi(
        "corners/checkpoint", Checkpointed(), _t(2, 8, 32), _float_mask())),
}  # fmt: skip
