"""The autocast and grad-mode regions of a captured graph: the higher-order ops whose body is a
submodule (``wrap_with_autocast``, ``wrap_with_set_grad_enabled``) and what each changes.

The capture's module view and trace-time reads walk into these bodies, as the annotator and the
checks do: the region ops are part of what a captured graph is, so they live with the capture.

>>> sorted(i for i in REGION_OPS.values())
[1, 4]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

WRAP_WITH_AUTOCAST = getattr(torch.ops.higher_order, "wrap_with_autocast", None)
WRAP_WITH_SET_GRAD_ENABLED = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)
#: Higher-order ops whose body is a submodule that ampgraph walks node by node. Index of the body.
REGION_OPS = {op: i for op, i in ((WRAP_WITH_AUTOCAST, 4), (WRAP_WITH_SET_GRAD_ENABLED, 1)) if op}


@dataclass(frozen=True)
class Region:
    """A region body and what it changes: autocast for one device type, or nothing ampgraph
    tracks (``wrap_with_set_grad_enabled``: grad mode does not change dtypes)."""

    body: fx.GraphModule
    operands: tuple[Any, ...]
    device_type: str | None = None
    dtype: torch.dtype | None = None
    enabled: bool = True

    @property
    def is_autocast(self) -> bool:
        return self.device_type is not None


def region_args(n: fx.Node, args: tuple[Any, ...]) -> Region:
    """Unpack ``wrap_with_autocast(device_type, dtype, enabled, cache_enabled, body, *operands)``
    or ``wrap_with_set_grad_enabled(enabled, body, *operands)``."""
    if n.target is WRAP_WITH_AUTOCAST:
        device_type, dtype, enabled, _cache, body, *operands = args
        if dtype is None:
            dtype = torch.get_autocast_dtype(device_type)
        return Region(body, tuple(operands), str(device_type), dtype, bool(enabled))
    _grad, body, *operands = args
    return Region(body, tuple(operands))


__all__ = ["REGION_OPS", "WRAP_WITH_AUTOCAST", "WRAP_WITH_SET_GRAD_ENABLED", "Region", "region_args"]
