"""Model factories for the CLI tests (``--module``-style specs ``tests.factories:NAME``)."""

from __future__ import annotations

import torch
from torch import nn


class DataDependent(nn.Module):
    """Branches on a tensor's value: torch.export cannot trace that with fake tensors, so
    ampgraph traces it along the path real, seeded random values take (draft-export)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x


def untraceable() -> tuple[nn.Module, tuple[torch.Tensor]]:
    return DataDependent(), (torch.randn(2, 2),)


class LeavesTorch(nn.Module):
    """Leaves torch for NumPy halfway: no tracer can follow that, with or without values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(x.numpy() * 2)


def leaves_torch() -> tuple[nn.Module, tuple[torch.Tensor]]:
    return LeavesTorch(), (torch.randn(2, 2),)


def raises() -> nn.Module:
    raise ValueError("no weights here")
