"""The state of one joint trace: who owns each joint-graph node, and what autograd saved.

:func:`ampgraph.train.backward.trace_joint` makes one :class:`TraceState` per trace and makes it
the active one (:data:`ACTIVE`) while ``make_fx`` runs the training step; the joint trace's
annotator and dispatch modes (:mod:`ampgraph.train.joint_annotator`) note in it what they learn.

>>> from ampgraph.settings import Setting
>>> trace_device(Setting.parse("amp-fp32")), trace_device(Setting.parse("autocast=on,device=cpu"))
('meta', 'cpu')
"""

from __future__ import annotations

import bisect
import contextvars
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.fx.experimental import proxy_tensor

from ampgraph.report.records import NodeRecord
from ampgraph.settings import Setting

#: node.meta key on the joint graph's ``_to_copy`` nodes that are autocast's casts.
AUTOCAST_CAST = "ampgraph_autocast_cast"
#: node.meta key: (phase, forward node) of every joint-graph node.
OWNER = "ampgraph_owner"
FORWARD, LOSS, BACKWARD, INPUT = "forward", "loss", "backward", "input"


def trace_device(setting: Setting) -> str:
    """Where the joint graph is traced: fake CPU tensors for CPU, the meta device for CUDA.

    >>> trace_device(Setting.parse("amp-fp32"))
    'meta'
    """
    return "cpu" if setting.device_type == "cpu" else "meta"


class _Segments:
    """Ranges of a growing sequence (graph nodes, autograd sequence numbers), each with an owner."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.owners: list[Any] = []

    def mark(self, start: int, owner: Any) -> None:
        if self.starts and self.starts[-1] == start:
            self.owners[-1] = owner
            return
        self.starts.append(start)
        self.owners.append(owner)

    def owner(self, index: int, default: Any = None) -> Any:
        i = bisect.bisect_right(self.starts, index) - 1
        return self.owners[i] if i >= 0 else default


@dataclass
class Packed:
    """A tensor autograd saved, as the pack hook saw it: the forward node that saved it and
    the joint-graph node that produced it."""

    owner: str | None
    tensor: torch.Tensor
    producer: str | None


@dataclass
class TraceState:
    """What one joint trace learns besides the graph."""

    setting: Setting
    graph: fx.Graph
    tracer: Any
    nodes: _Segments = field(default_factory=_Segments)
    seq: _Segments = field(default_factory=_Segments)
    stack: list[tuple[str, str | None]] = field(default_factory=list)
    saved: list[Packed] = field(default_factory=list)
    #: autocast's cast cache: (id(parameter), dtype) -> the cast (a leaf fp32 tensor that
    #: requires grad is cast once per autocast context, as ``cached_cast`` does).
    cast_cache: dict[tuple[int, torch.dtype], torch.Tensor] = field(default_factory=dict)
    keep: list[torch.Tensor] = field(default_factory=list)
    forward_records: list[NodeRecord] = field(default_factory=list)
    #: storage of each graph input -> its kind (parameter, buffer, input, constant).
    input_storages: dict[int, str] = field(default_factory=dict)
    #: the dtype conversions of parameters and buffers made in the forward.
    copies: Any = None

    def enter(self, owner: tuple[str, str | None]) -> None:
        self.stack.append(owner)
        self._mark(owner)

    def exit(self) -> None:
        self.stack.pop()
        self._mark(self.stack[-1] if self.stack else (FORWARD, None))

    def _mark(self, owner: tuple[str, str | None]) -> None:
        self.nodes.mark(len(self.graph.nodes), owner)
        self.seq.mark(torch.autograd._get_sequence_nr(), owner)

    def node_of(self, t: torch.Tensor) -> fx.Node | None:
        """The joint-graph node that produced ``t``."""
        slot = proxy_tensor.get_proxy_slot(t, self.tracer, None)
        return slot.proxy.node if slot is not None else None

    def new_nodes(self, since: int) -> list[fx.Node]:
        """Nodes added to the graph since it had ``since`` nodes, in order."""
        out = []
        node = self.graph._root.prev
        for _ in range(len(self.graph.nodes) - since):
            out.append(node)
            node = node.prev
        return out[::-1]


#: The trace under way: set by :func:`ampgraph.train.backward.trace_joint` while it traces.
ACTIVE: contextvars.ContextVar[TraceState | None] = contextvars.ContextVar(
    "ampgraph_joint_trace", default=None
)


def active_state() -> TraceState:
    """The state of the joint trace under way; only while one is (inside ``trace_joint``).

    >>> ACTIVE.get() is None
    True
    """
    state = ACTIVE.get()
    assert state is not None, "only inside trace_joint"
    return state


__all__ = [
    "ACTIVE",
    "AUTOCAST_CAST",
    "BACKWARD",
    "FORWARD",
    "INPUT",
    "LOSS",
    "OWNER",
    "Packed",
    "TraceState",
    "active_state",
    "trace_device",
]
