"""What changes between two recipes' FP8 graphs (a recipe before and after the advisor's
filter, or two recipes), as records: which Linears change side, which modules' forward GEMMs
change, and the backward's GEMMs by kind. ``ampgraph diff --recipe torchao:A --recipe
torchao:B`` prints them (:func:`ampgraph.formats.fp8.change_lines`), as ``ampgraph table
--recipe torchao:...`` prints each GEMM (:func:`ampgraph.formats.fp8.gemm_lines`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ampgraph.fp8.graph import Fp8Graph, Fp8Node


@dataclass(frozen=True)
class Gemm:
    """One GEMM as a table row or a diff shows it: its op, its matrix operands (their dtypes,
    and each one's scaling for a scaled GEMM, or the MX format it was dequantized from for
    torchao's emulated MX GEMM), its output dtype, and whether its operands' dtypes are a mixed
    pair, on which the real kernel raises. Two GEMMs that show the same are equal."""

    op: str
    operands: tuple[str, ...]
    scaling: tuple[str, ...]
    out: str
    mixed: bool
    dequantized: bool = False


def gemm_of(g: Fp8Node) -> Gemm:
    """``g`` as :class:`Gemm`: a scaled GEMM's first two inputs (the matrices; scales follow),
    a grouped GEMM's first two (its offsets follow), the last two of any other GEMM
    (``addmm``'s bias comes first)."""
    mixed = g.role == "gemm-mixed"
    if g.op in ("_scaled_mm", "_scaled_grouped_mm"):
        pairs = list(zip(g.dtype_in[:2], g.scaling, strict=False))
        return Gemm(g.op, tuple(d for d, _ in pairs), tuple(s for _, s in pairs), g.dtype_out, mixed)
    mats = g.dtype_in[:2] if g.op == "_grouped_mm" else g.dtype_in[-2:]
    if g.role == "gemm-mx-emulated":
        pairs = list(zip(mats, g.scaling, strict=False))
        return Gemm(g.op, tuple(d for d, _ in pairs), tuple(s for _, s in pairs), g.dtype_out,
                    mixed, dequantized=True)  # fmt: skip
    return Gemm(g.op, tuple(mats), (), g.dtype_out, mixed)


@dataclass(frozen=True)
class SideChange:
    """A Linear converted to FP8 on one side and kept in bf16 on the other; ``reason`` is B's."""

    fqn: str
    converted: tuple[bool, bool]
    reason: str


@dataclass(frozen=True)
class Fp8Changes:
    """What changes from graph A to graph B (:func:`compare`): the Linears that change side,
    each module whose forward GEMMs change (A's, then B's), and each kind of backward GEMM
    whose count changes (A's count, B's)."""

    sides: tuple[SideChange, ...]
    forward: tuple[tuple[str, tuple[Gemm, ...], tuple[Gemm, ...]], ...]
    backward: tuple[tuple[Gemm, int, int], ...]

    @property
    def equal(self) -> bool:
        return not (self.sides or self.forward or self.backward)


def compare(a: Fp8Graph, b: Fp8Graph) -> Fp8Changes:
    """What changes from ``a`` to ``b``.

    >>> import torch
    >>> from torch import nn
    >>> from ampgraph.fp8.graph import trace_fp8
    >>> from ampgraph.fp8.recipes import parse_fp8_recipe
    >>> from ampgraph.model.build import ModelInputs
    >>> m = ModelInputs("mlp", nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 16)),
    ...                 (torch.randn(8, 32),))
    >>> before = trace_fp8(m, parse_fp8_recipe("torchao:tensorwise"))
    >>> after = trace_fp8(m, parse_fp8_recipe("torchao:tensorwise,filter_fqns=1"))
    >>> changes = compare(before, after)
    >>> changes.sides
    (SideChange(fqn='1', converted=(True, False), reason="filtered by name (matches '1')"),)
    >>> [(module, [g.op for g in was], [g.op for g in now]) for module, was, now in changes.forward]
    [('1', ['_scaled_mm'], ['addmm'])]
    """
    plans_b = {p.fqn: p for p in b.plans}
    sides = tuple(
        SideChange(p.fqn, (p.converted, q.converted), q.reason)
        for p in a.plans
        if (q := plans_b.get(p.fqn)) is not None and q.converted != p.converted
    )
    forward: dict[str, tuple[list[Gemm], list[Gemm]]] = {}
    for side, graph in enumerate((a, b)):
        for g in graph.gemms("forward"):
            forward.setdefault(g.module, ([], []))[side].append(gemm_of(g))
    kinds = [Counter(gemm_of(g) for g in graph.gemms("backward")) for graph in (a, b)]
    return Fp8Changes(
        sides,
        tuple((m, tuple(was), tuple(now)) for m, (was, now) in forward.items() if was != now),
        tuple((k, kinds[0][k], kinds[1][k]) for k in dict.fromkeys([*kinds[0], *kinds[1]])
              if kinds[0][k] != kinds[1][k]),
    )  # fmt: skip


__all__ = ["Fp8Changes", "Gemm", "SideChange", "compare", "gemm_of"]
