"""The small model the recipe pages draw: ``block.py:tiny_block`` in their ``ampgraph`` figures.

It is ``tests/test_recipes.py``'s ``Block`` -- Linear, residual add, LayerNorm, matmul, softmax,
matmul, Linear: the ops autocast treats apart -- behind an embedding, so that its input is token
ids. No recipe casts token ids, so every recipe's input cast leaves this model's forward as the
recipe's setting alone analyses it; and it has no floating buffers for FSDP or DeepSpeed to keep
in fp32. What differs between two recipes in its figures is what their settings differ in.
"""

from __future__ import annotations

import torch
from torch import nn


class TinyBlock(nn.Module):
    """An embedding, then ``Block``: ``fc2(softmax(h @ hᵀ) @ h)`` with ``h = norm(fc1(x) + x)``."""

    def __init__(self, vocab: int = 32, width: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.fc1 = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.fc2 = nn.Linear(width, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits of shape ``(batch, seq, 4)`` for token ids of shape ``(batch, seq)``."""
        x = self.embed(ids)
        h = self.norm(self.fc1(x) + x)
        attn = torch.softmax(h @ h.transpose(-1, -2), dim=-1)
        return self.fc2(attn @ h)


def tiny_block() -> tuple[nn.Module, torch.Tensor]:
    """The model and its example input, as ``ampgraph --module`` takes a factory."""
    return TinyBlock(), torch.randint(0, 32, (2, 3))
