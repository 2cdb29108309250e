"""Model factories for the CLI tests (``--module``-style specs ``tests.factories:NAME``), and the
checkpoint writers the weight-reading tests share."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

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


def write_shards(
    folder: Path, tensors: Iterable[tuple[str, torch.Tensor]], *, count: int | None = None
) -> dict[str, str]:
    """One safetensors shard per ``(name, tensor)`` in ``folder``, written one at a time (from a
    generator, a checkpoint larger than memory is never whole); named as transformers names
    them, ``model-0000i-of-0000n.safetensors`` given the ``count``, else ``model-0000i``. The
    weight map: each name's shard."""
    from safetensors.torch import save_file

    weight_map = {}
    for i, (name, tensor) in enumerate(tensors, start=1):
        shard = f"model-{i:05d}-of-{count:05d}" if count else f"model-{i:05d}"
        save_file({name: tensor}, str(folder / f"{shard}.safetensors"))
        weight_map[name] = f"{shard}.safetensors"
    return weight_map


def write_index(folder: Path, weight_map: dict[str, str]) -> None:
    """``model.safetensors.index.json``: the weight map of a sharded checkpoint."""
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
