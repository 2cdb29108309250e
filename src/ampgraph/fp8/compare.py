"""An FP8 graph as a table of its GEMMs, and what changes between two recipes' graphs.

What ``ampgraph table`` / ``ampgraph diff`` print under ``--recipe torchao:...``: the same
:class:`~ampgraph.fp8.graph.Fp8Graph` that ``ampgraph fp8`` prints, one line per matrix product
(its module, its operands' formats and scalings, its output), and between two recipes (a recipe
before and after the advisor's filter) which Linears changed side and which GEMMs changed.
"""

from __future__ import annotations

from collections import Counter

from ampgraph.fp8.graph import Fp8Graph, Fp8Node
from ampgraph.report.escape import code_span


def _operands(g: Fp8Node) -> str:
    """``e4m3 tensorwise, e4m3 tensorwise`` for a ``_scaled_mm``; ``bf16 from e4m3 mx-1x32``
    for torchao's emulated MX GEMM (dequantized operands); the matrices' dtypes else (a grouped
    GEMM's come first, before its offsets)."""
    if g.op in ("_scaled_mm", "_scaled_grouped_mm"):
        return ", ".join(f"{d} {s}" for d, s in zip(g.dtype_in[:2], g.scaling, strict=False))
    mats = g.dtype_in[:2] if g.op in ("_grouped_mm", "_scaled_grouped_mm") else g.dtype_in[-2:]
    if g.role == "gemm-mx-emulated":
        return ", ".join(f"{d} from {s}" for d, s in zip(mats, g.scaling, strict=False))
    return ", ".join(mats)


def gemm_text(g: Fp8Node) -> str:
    """One GEMM as a line: ``op(operands) -> out``, and a mixed pair's fate."""
    raises = "  <- mixed operand dtypes: the real kernel raises" if g.role == "gemm-mixed" else ""
    return f"{g.op}({_operands(g)}) -> {g.dtype_out}{raises}"


def gemm_lines(graph: Fp8Graph, phases: tuple[str, ...] = ("forward", "backward")) -> list[str]:
    """One line per GEMM of ``phases``, in graph order, as forward hooks print a module call.

    The backward's GEMMs run outside any module's call: they are listed by position.

    >>> import torch
    >>> from torch import nn
    >>> from ampgraph.fp8.graph import trace_fp8
    >>> from ampgraph.fp8.recipes import parse_fp8_recipe
    >>> from ampgraph.model.build import ModelInputs
    >>> m = ModelInputs("mlp", nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 16)),
    ...                 (torch.randn(8, 32),))
    >>> g = trace_fp8(m, parse_fp8_recipe("torchao:rowwise,filter_fqns=1"))
    >>> print("\\n".join(gemm_lines(g)))
    [0] forward _scaled_mm(e4m3 rowwise, e4m3 rowwise) -> bf16
    [1] forward addmm(bf16, bf16) -> bf16
    """
    lines = []
    for phase in phases:
        for i, g in enumerate(graph.gemms(phase)):
            where = g.module if phase == "forward" else f"backward GEMM {i}"
            lines.append(f"[{where}] {phase} {gemm_text(g)}")
    return lines


def gemm_markdown(graph: Fp8Graph, phases: tuple[str, ...] = ("forward", "backward")) -> str:
    """The GEMMs as a Markdown table (module, pass, op, operands, output)."""
    rows = ["| module | pass | GEMM | operands | output |", "| --- | --- | --- | --- | --- |"]
    for phase in phases:
        for i, g in enumerate(graph.gemms(phase)):
            where = code_span(g.module) if phase == "forward" else f"GEMM {i}"
            rows.append(f"| {where} | {phase} | `{g.op}` | {_operands(g)} | {g.dtype_out} |")
    return "\n".join(rows)


def compare(a: Fp8Graph, b: Fp8Graph) -> list[str]:
    """What changes from ``a`` to ``b``: each Linear that changes side (FP8 or bf16, and why),
    each module whose forward GEMMs change, and the backward's GEMMs by kind. Empty: equal.

    >>> import torch
    >>> from torch import nn
    >>> from ampgraph.fp8.graph import trace_fp8
    >>> from ampgraph.fp8.recipes import parse_fp8_recipe
    >>> from ampgraph.model.build import ModelInputs
    >>> m = ModelInputs("mlp", nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 16)),
    ...                 (torch.randn(8, 32),))
    >>> before = trace_fp8(m, parse_fp8_recipe("torchao:tensorwise"))
    >>> after = trace_fp8(m, parse_fp8_recipe("torchao:tensorwise,filter_fqns=1"))
    >>> print("\\n".join(compare(before, after)))
    1: FP8 -> bf16 (filtered by name (matches '1'))
    [1] forward: _scaled_mm(e4m3 tensorwise, e4m3 tensorwise) -> bf16 => addmm(bf16, bf16) -> bf16
    """
    lines = []
    plans_b = {p.fqn: p for p in b.plans}
    for p in a.plans:
        q = plans_b.get(p.fqn)
        if q is not None and q.converted != p.converted:
            side = ("FP8", "bf16")
            lines.append(f"{p.fqn}: {side[not p.converted]} -> {side[not q.converted]} "
                         f"({q.reason})")
    forward = {}
    for side, graph in enumerate((a, b)):
        for g in graph.gemms("forward"):
            forward.setdefault(g.module, ([], []))[side].append(gemm_text(g))
    for module, (was, now) in forward.items():
        if was != now:
            lines.append(f"[{module}] forward: {'; '.join(was) or '-'} => {'; '.join(now) or '-'}")
    kinds = [Counter(gemm_text(g) for g in graph.gemms("backward")) for graph in (a, b)]
    for kind in dict.fromkeys([*kinds[0], *kinds[1]]):
        if kinds[0][kind] != kinds[1][kind]:
            lines.append(f"backward: {kinds[0][kind]} -> {kinds[1][kind]} x {kind}")
    return lines
