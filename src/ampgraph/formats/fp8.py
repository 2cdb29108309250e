"""torchao's FP8 recipes as text and JSON: ``ampgraph fp8`` (which GEMMs run in which format) and
``ampgraph fp8-ranges`` (each FP8 operand's survival).

>>> from types import SimpleNamespace as NS
>>> s = NS(zero_share=0.5, saturated_share=0.0, rel_error=0.25)
>>> row_text(NS(module="fc1", operand="input", fmt="e4m3", scaling="tensorwise", survival=s))
'  fc1                                      input  e4m3 tensorwise zeros 50.0000%  saturated  0.0000%  rms error 25.00%'
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the fp8 and ranges packages import torch
    from ampgraph.fp8.graph import Fp8Graph
    from ampgraph.fp8.proof import GemmProof
    from ampgraph.fp8.recipes import Fp8Recipe
    from ampgraph.ranges.fp8 import OperandRow


def graph_text(graph: Fp8Graph) -> str:
    """Which Linears convert, the GEMMs of each phase by kind, and the scaling nodes' counts."""
    lines = [f"recipe {graph.recipe.spelling}: Linears' GEMMs per torchao, the rest under CPU "
             "bf16 autocast"]  # fmt: skip
    for p in graph.plans:
        where = "FP8 " if p.converted else "bf16"
        lines.append(f"  {where}  {p.fqn or '(root)'}  [{p.out_features}x{p.in_features}]  "
                     f"{p.reason}")  # fmt: skip
    for phase in ("forward", "backward"):
        gemms = graph.gemms(phase)
        if not gemms:
            continue
        lines.append(f"{phase}: {len(gemms)} GEMMs")
        kinds = Counter((g.op, g.dtype_in[-2:] if g.op == "addmm" else g.dtype_in[:2],
                         g.scaling, g.dtype_out, g.role) for g in gemms)  # fmt: skip
        for (op, ins, scaling, out, role), n in kinds.items():
            how = f" scaled {'/'.join(scaling)}" if scaling else ""
            if role == "gemm-mx-emulated":  # torchao's EMULATED kernel: MXFP8 values in bf16
                how = f" on MXFP8 dequantized to bf16 ({'/'.join(scaling)}, emulated)"
            raises = ("  <- mixed operand dtypes: the real kernel raises"
                      if role == "gemm-mixed" else "")  # fmt: skip
            lines.append(f"  {n:4d} x {op}({', '.join(ins)}){how} -> {out}{raises}")
    roles = Counter(n.role for n in graph.nodes)
    lines.append(f"scale computation {roles['scale']} nodes, operand scaling and clamps "
                 f"{roles['scaling']}, casts to FP8 {roles['cast-fp8']}, "
                 + (f"dequantized to bf16 {roles['dequant']}, " if roles["dequant"] else "")
                 + f"other {roles['other']}")  # fmt: skip
    return "\n".join(lines)


def fp8_text(graph: Fp8Graph, *, proof: GemmProof | None = None) -> str:
    """``ampgraph fp8``: :func:`graph_text`, and the real run's agreement where ``--check`` ran
    one and it agrees (a difference is the command's error line)."""
    text = graph_text(graph)
    if proof is not None and proof.ok:
        raised = proof.real and proof.real[-1][0] == "raised"
        text += (f"\ncheck: all {len(proof.real) - raised} GEMMs agree with a real CPU run"
                 + (", which raises where predicted" if raised else ""))  # fmt: skip
    return text


def fp8_json(graph: Fp8Graph, *, proof: GemmProof | None = None) -> str:
    """``ampgraph fp8 --format json``: the graph's record, with the real run's ``check``."""
    data = graph.to_dict()
    if proof is not None:
        data["check"] = {"ok": proof.ok, "gemms": len(proof.real),
                         "first_difference": proof.first_difference()}  # fmt: skip
    return json.dumps(data, indent=1)


def row_text(row: OperandRow) -> str:
    """One operand's survival: zeros, saturated values and the RMS error of its FP8 copy."""
    s = row.survival
    return (f"  {row.module:<40} {row.operand:<6} {row.fmt} {row.scaling:<10} "
            f"zeros {s.zero_share:8.4%}  saturated {s.saturated_share:8.4%}  "
            f"rms error {s.rel_error:.2%}")  # fmt: skip


def survival_text(
    rows: Sequence[OperandRow], *, recipe: Fp8Recipe, top: int, proved: bool | None,
    keep: Sequence[str] | None, after: Sequence[OperandRow], max_zero_share: float,
    pass_: str = "forward", te: bool = False,
) -> str:  # fmt: skip
    """``ampgraph fp8-ranges``: the ``top`` worst operands; the proof where it holds (``proved``
    None: not asked); with ``keep`` (None: not asked) the advice, its filter and the survival
    before against after it."""
    from ampgraph.ranges import fp8 as fp8_ranges

    lines = []
    if te:  # TransformerEngine's rules, read from its source: say that no TE code ran
        from ampgraph.fp8.te import CONVERTED, NOT_IMPORTED

        lines.append(f"{NOT_IMPORTED}; each nn.Linear {CONVERTED}")
    lines += [f"recipe {recipe.spelling}: {len(rows)} FP8 GEMM operands, worst first",
              "\n".join(row_text(r) for r in rows[:top])]  # fmt: skip
    if proved:
        lines.append(f"proved: all {len(rows)} operands' counts equal torchao's real "
                     "conversion of the same tensors")  # fmt: skip
    if keep is not None and not keep:
        lines.append(f"advice: no operand flushes more than {max_zero_share:.2%}: "
                     "no filter needed")  # fmt: skip
    elif keep is not None:
        lines += [f"advice: keep {len(keep)} Linears in bf16 "
                  f"(recipe {recipe.with_filter(keep).spelling})",
                  fp8_ranges.filter_code(keep), "\n".join(fp8_ranges.diff_tables(rows, after))]  # fmt: skip
    return "\n".join(lines)


def survival_json(
    rows: Sequence[OperandRow], *, recipe: Fp8Recipe, top: int, proved: bool | None,
    keep: Sequence[str] | None, after: Sequence[OperandRow], max_zero_share: float,
    pass_: str = "forward", te: bool = False,
) -> str:  # fmt: skip
    """``ampgraph fp8-ranges --format json``: every operand, the proof and the advice where
    asked."""
    data: dict[str, Any] = {"recipe": recipe.spelling, "pass": pass_,
                            "te_code_ran": False if te else None,
                            "operands": [r.to_dict() for r in rows]}  # fmt: skip
    if proved is not None:
        data["proved"] = {"ok": proved, "operands": len(rows)}
    if keep is not None:
        data["advice"] = {"filter_fqns": list(keep),
                          "recipe": recipe.with_filter(keep).spelling,
                          "after": [r.to_dict() for r in after]}  # fmt: skip
    return json.dumps(data, indent=1)


# -- --recipe torchao:... on the setting commands and diff (ampgraph.cli.fp8_settings) -----------


def table_text(graph: Fp8Graph, *, phases: Sequence[str]) -> str:
    """``table --recipe torchao:...``: the recipe's line, then each GEMM's."""
    from ampgraph.fp8.compare import gemm_lines

    return graph_text(graph).splitlines()[0] + "\n" + "\n".join(gemm_lines(graph, tuple(phases)))


def table_markdown(graph: Fp8Graph, *, phases: Sequence[str]) -> str:
    """``table --recipe torchao:... --format markdown``."""
    from ampgraph.fp8.compare import gemm_markdown

    return gemm_markdown(graph, tuple(phases))


def table_json(graph: Fp8Graph, *, phases: Sequence[str]) -> str:
    """``table --recipe torchao:... --format json``: the FP8 graph's record."""
    return json.dumps(graph.to_dict(), indent=1)


def proof_text(proof: Any, *, recipe: str) -> str:
    """``check --recipe torchao:...``: whether every GEMM's dtypes agree with the real run."""
    if not proof.ok:
        return f"{recipe}: the real CPU run differs: {proof.first_difference()}"
    raised = bool(proof.real) and proof.real[-1][0] == "raised"
    return (f"{recipe}: all {len(proof.real) - raised} GEMMs' dtypes agree with a real CPU run "
            "of torchao's converted model" + (", which raises where predicted" if raised else ""))  # fmt: skip


def proof_json(proof: Any, *, recipe: str) -> str:
    """``check --recipe torchao:... --format json``."""
    return json.dumps([{"recipe": recipe, "ok": proof.ok, "gemms": len(proof.real),
                        "first_difference": proof.first_difference()}], indent=1)  # fmt: skip


def _findings_lines(found: Sequence[Any], recipe: str, operands: int, bullet: str) -> str:
    lines = [f"{bullet}{recipe}: {operands} FP8 GEMM operands of the forward, "
             f"{len(found)} finding{'s' if len(found) != 1 else ''}"]  # fmt: skip
    lines += [f"{bullet}{severity}: {row.module} {row.operand}: {message}"
              for severity, row, message in found]  # fmt: skip
    return "\n".join(lines)


def findings_text(found: Sequence[Any], *, recipe: str, operands: int) -> str:
    """``audit --recipe torchao:...``: (severity, row, message) findings, one a line."""
    return _findings_lines(found, recipe, operands, "")


def findings_markdown(found: Sequence[Any], *, recipe: str, operands: int) -> str:
    """``audit --recipe torchao:... --format markdown``: the same lines as a list."""
    return _findings_lines(found, recipe, operands, "- ")


def findings_json(found: Sequence[Any], *, recipe: str, operands: int) -> str:
    """``audit --recipe torchao:... --format json``."""
    return json.dumps({"recipe": recipe, "findings": [
        {"severity": s, "module": r.module, "operand": r.operand, "message": m}
        for s, r, m in found]}, indent=1)  # fmt: skip


def _recipes_diff(changes: Sequence[str], a: str, b: str, survival: Sequence[str], bullet: str) -> str:
    lines = [f"A: {a}", f"B: {b}", *(changes or ["the FP8 graphs are the same"]), *survival]
    return "\n".join(bullet + line for line in lines)


def recipes_diff_text(changes: Sequence[str], *, a: str, b: str, survival: Sequence[str],
                      equal: bool) -> str:  # fmt: skip
    """``diff --recipe torchao:A --recipe torchao:B``: the graphs' changes, then the survival's."""
    return _recipes_diff(changes, a, b, survival, "")


def recipes_diff_markdown(changes: Sequence[str], *, a: str, b: str, survival: Sequence[str],
                          equal: bool) -> str:  # fmt: skip
    """The same as a Markdown list."""
    return _recipes_diff(changes, a, b, survival, "- ")


def recipes_diff_json(changes: Sequence[str], *, a: str, b: str, survival: Sequence[str],
                      equal: bool) -> str:  # fmt: skip
    """``--format json``."""
    return json.dumps({"a": a, "b": b, "equal": equal, "changes": list(changes),
                       "survival": list(survival)}, indent=1)  # fmt: skip


__all__ = [
    "findings_json", "findings_markdown", "findings_text", "fp8_json", "fp8_text", "graph_text",
    "proof_json", "proof_text", "recipes_diff_json", "recipes_diff_markdown", "recipes_diff_text",
    "row_text", "survival_json", "survival_text", "table_json", "table_markdown", "table_text",
]  # fmt: skip
