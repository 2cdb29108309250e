"""The compiled dtype flow as plain data: what Inductor does with each node's 16-bit value.

No torch here: :mod:`ampgraph.compiled.inductor` fills these records from Inductor's own
lowering and scheduler, and the commands, the formats and the renderer read them.

A node's *fate* under ``torch.compile`` is one of:

* ``stored``: its value is a buffer Inductor writes to memory in the node's dtype: a 16-bit
  value is rounded there exactly as eager rounds it;
* ``extern``: an extern kernel (a matmul, a convolution, a fallback op) writes it, as eager does;
* ``in-register``: Inductor inlined or fused it into a kernel that keeps it in fp32 and never
  stores it: where the node's eager dtype is 16-bit, **the eager rounding is dropped**;
* ``emulated``: in-register too, but rounded to its 16-bit dtype and widened again in the
  kernel (``emulate_precision_casts``), so it holds eager's value;
* ``removed``: a graph pass of Inductor's removed the node's value altogether (a cast pair);
* ``eager``: in a ``torch.compiler.disable`` region, which ``torch.compile`` runs eagerly
  between two compiled graphs (a graph break): rounded as eager rounds it.

>>> n = CompiledNode("gelu", "", "bfloat16", "in-register", "op4")
>>> n.drops_rounding
True
>>> CompiledNode("linear", "f", "bfloat16", "extern", "op3").drops_rounding
False
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

#: The 16-bit floating dtypes whose rounding eager performs after every op.
LOW_PRECISION = ("bfloat16", "float16")
FATES = ("stored", "extern", "in-register", "emulated", "removed", "eager")


@dataclass(frozen=True)
class CompiledNode:
    """One node of ampgraph's graph under Inductor: its eager output dtype and its fate."""

    name: str
    module: str
    dtype: str
    fate: str
    #: The kernel (Inductor scheduler node) that computes it, None where none does.
    kernel: str | None = None
    #: The buffer it is stored in (``buf3``), None where it is not stored.
    buffer: str | None = None
    #: False for a view (``transpose``, ``reshape``) or an op whose output is exactly one of its
    #: input's values (``embedding``, ``cat``, ``relu``): eager rounds nothing there, so there is
    #: no rounding of its own to keep or drop.
    computes: bool = True
    #: Whether an op reads this value unrounded: it is kept in fp32 and some consumer computes
    #: on it (directly or through views and copies that are never stored). A value that reaches
    #: only a store in its dtype is rounded there once, as eager rounds it.
    read_unrounded: bool = True
    #: Whether an Inductor pattern replacement absorbed it (``softmax(x * s)``'s scale): its math
    #: is in the replacement's kernel, but the value eager rounds is no node of the rewritten
    #: graph, so ``emulate_precision_casts``, which rounds nodes, cannot round it.
    folded: bool = False

    @property
    def rounds_in_kernel(self) -> bool:
        """Whether the compiled program rounds this value to 16 bits inside a kernel and computes
        on it: a rounding it would drop, kept by ``emulate_precision_casts``."""
        return (self.computes and self.read_unrounded and self.dtype in LOW_PRECISION
                and self.fate == "emulated")  # fmt: skip

    @property
    def drops_rounding(self) -> bool:
        """Whether eager rounds this value to 16 bits and the compiled program does not."""
        return (self.computes and self.read_unrounded and self.dtype in LOW_PRECISION
                and self.fate == "in-register")  # fmt: skip


@dataclass(frozen=True)
class CompiledCast:
    """A dtype conversion autocast or a decomposition put in the lowered graph, and its fate."""

    node: str
    owner: str
    source: str
    target: str
    fate: str
    kernel: str | None = None


@dataclass(frozen=True)
class Kernel:
    """One kernel Inductor's scheduler planned: a fused loop nest or an extern call."""

    name: str
    #: ``pointwise``, ``reduction``, ``extern``, ``template`` or ``nop``.
    kind: str
    #: The ampgraph nodes it computes (stored or in registers), in graph order.
    nodes: tuple[str, ...]
    #: The buffers it writes, as (name, dtype).
    stores: tuple[tuple[str, str], ...]
    #: For an extern kernel, the function it calls (``extern_kernels.addmm``).
    call: str | None = None


@dataclass
class CompiledFlow:
    """What Inductor plans for one graph in one setting, and for which torch and options."""

    model: str
    setting: str
    torch_version: str
    backend: str
    options: dict[str, Any]
    nodes: list[CompiledNode] = field(default_factory=list)
    casts: list[CompiledCast] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)
    #: ampgraph nodes Inductor lowered to nothing it records (views folded into an index) and
    #: that no recorded pattern replacement folded into a kernel: the views and diff name them.
    unmapped: list[str] = field(default_factory=list)
    #: How many graphs Inductor compiles (more than one where the model breaks the graph; their
    #: kernels are named ``g0.op3``, ``g1.op0``, ...).
    graphs: int = 1
    #: The ``torch.compiler.disable`` functions run eagerly between them, in graph order.
    eager_regions: list[str] = field(default_factory=list)

    def dropped(self) -> list[CompiledNode]:
        """The nodes whose eager 16-bit rounding the compiled program drops."""
        return [n for n in self.nodes if n.drops_rounding]

    def node(self, name: str) -> CompiledNode | None:
        """The record of ampgraph node ``name``, None where Inductor has none."""
        return next((n for n in self.nodes if n.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompiledFlow:
        """The inverse of :meth:`to_dict` (a cached analysis read back)."""
        k = [Kernel(**{**x, "nodes": tuple(x["nodes"]),
                       "stores": tuple(tuple(s) for s in x["stores"])}) for x in data["kernels"]]  # fmt: skip
        return cls(
            data["model"], data["setting"], data["torch_version"], data["backend"],
            dict(data["options"]), [CompiledNode(**n) for n in data["nodes"]],
            [CompiledCast(**c) for c in data["casts"]], k, list(data.get("unmapped", [])),
            data.get("graphs", 1), list(data.get("eager_regions", [])),
        )  # fmt: skip


def differing_roundings(
    a: CompiledFlow | None, b: CompiledFlow | None
) -> list[tuple[int, CompiledNode]]:  # fmt: skip
    """The eager roundings one side drops and the other keeps, matched by module and node name,
    each with the side that drops it (0 for ``a``); a side None is eager, which drops none. The
    two sides are equal where this is empty.

    >>> f = CompiledFlow("m", "s", "t", "cpp", {},
    ...                  [CompiledNode("gelu", "", "bfloat16", "in-register")])
    >>> [(side, n.name) for side, n in differing_roundings(None, f)], differing_roundings(f, f)
    ([(1, 'gelu')], [])
    """
    dropped = [{(n.module, n.name): n for n in f.dropped()} if f else {} for f in (a, b)]
    return [(0, n) if key in dropped[0] else (1, n)
            for key, n in {**dropped[0], **dropped[1]}.items()
            if (key in dropped[0]) != (key in dropped[1])]  # fmt: skip


@dataclass(frozen=True)
class Gradient:
    """A trainable input's gradient as the compiled backward returns it."""

    #: The parameter's name in the module (``f.weight``).
    input: str
    dtype: str
    param_dtype: str


@dataclass(frozen=True)
class BackwardOp:
    """One op of the compiled backward graph (after Inductor's decompositions)."""

    name: str
    op: str
    module: str
    dtype: str
    #: The autograd sequence number of the forward op it differentiates, counted from the
    #: forward graph's first (None for the graph's own ops).
    seq: int | None


@dataclass
class CompiledTrain:
    """Inductor's plan for a training step: the forward and backward graphs AOT autograd splits."""

    forward: CompiledFlow
    backward: CompiledFlow
    #: ``backward_pass_autocast`` as the plan ran (``same_as_forward``, ``off`` or a list's repr).
    backward_pass_autocast: str
    #: Its default on the plan's torch release (None outside the supported range).
    release_default: str | None
    #: Whether the setting's autocast was on while the backward was traced.
    backward_autocast: bool
    gradients: list[Gradient] = field(default_factory=list)
    ops: list[BackwardOp] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompiledTrain:
        """The inverse of :meth:`to_dict`."""
        return cls(CompiledFlow.from_dict(data["forward"]),
                   CompiledFlow.from_dict(data["backward"]), data["backward_pass_autocast"],
                   data["release_default"], data["backward_autocast"],
                   [Gradient(**g) for g in data["gradients"]],
                   [BackwardOp(**o) for o in data["ops"]])  # fmt: skip


def autocast_changes(
    a: CompiledTrain, b: CompiledTrain
) -> list[tuple[BackwardOp, BackwardOp]]:  # fmt: skip
    """The backward ops of ``a`` that ``b`` computes in another dtype, matched by the forward op
    they differentiate, their op, module and order among those (ops that only one of the two
    has, casts and what the partitioner saves or recomputes, are left out).

    >>> op = BackwardOp("mm", "aten::mm", "f", "bfloat16", 3)
    >>> base = CompiledFlow("m", "s", "t", "cpp", {})
    >>> x = CompiledTrain(base, base, "same_as_forward", None, True, ops=[op])
    >>> y = CompiledTrain(base, base, "off", None, False, ops=[BackwardOp("mm", "aten::mm", "f", "float32", 3)])
    >>> [(p.dtype, q.dtype) for p, q in autocast_changes(x, y)]
    [('bfloat16', 'float32')]
    """
    theirs = dict(_keyed(b.ops))
    return [(op, theirs[k]) for k, op in _keyed(a.ops)
            if k in theirs and theirs[k].dtype != op.dtype]  # fmt: skip


def _keyed(ops: list[BackwardOp]) -> list[tuple[tuple[Any, ...], BackwardOp]]:
    seen: Counter[tuple[Any, ...]] = Counter()
    out = []
    for op in ops:
        key = (op.seq, op.op, op.module)
        out.append(((*key, seen[key]), op))
        seen[key] += 1
    return out
