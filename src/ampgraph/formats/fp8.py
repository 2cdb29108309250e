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

from ampgraph.report.escape import code_span

if TYPE_CHECKING:  # annotations only: the fp8 and ranges packages import torch
    from ampgraph.fp8.compare import Fp8Changes, Gemm
    from ampgraph.fp8.graph import FlowStep, Fp8Graph, Fp8Node, ModuleFlow
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
            if role == "gemm-mx-emulated":  # torchao's EMULATED kernel: MXFP8 values cast up
                # (bf16 in a MoE's grouped GEMM; a dense mx_mm's, the input's own dtype)
                how = f" on MXFP8 dequantized to {ins[0]} ({'/'.join(scaling)}, emulated)"
            raises = ("  <- mixed operand dtypes: the real kernel raises"
                      if role == "gemm-mixed" else "")  # fmt: skip
            lines.append(f"  {n:4d} x {op}({', '.join(ins)}){how} -> {out}{raises}")
    roles = Counter(n.role for n in graph.nodes)
    lines.append(f"scale computation {roles['scale']} nodes, operand scaling and clamps "
                 f"{roles['scaling']}, casts to FP8 {roles['cast-fp8']}, "
                 + (f"dequantization {roles['dequant']}, " if roles["dequant"] else "")
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
                  filter_code(keep), "\n".join(survival_changes(rows, after))]  # fmt: skip
    return "\n".join(lines)


def filter_code(keep: Sequence[str]) -> str:
    """The advisor's filter (``fp8-ranges --advise``; ``--write-filter`` writes it to a file) as
    torchao's ``module_filter_fn`` and torchtitan's ``filter_fqns``; no line end.

    >>> print(filter_code(["lm_head"]).splitlines()[1])
    KEEP_BF16 = ['lm_head']
    """
    return "\n".join([
        "# torchao: convert_to_float8_training(model, config=..., module_filter_fn=keep_fp8)",
        f"KEEP_BF16 = {list(keep)!r}",
        "def keep_fp8(mod, fqn):",
        "    return not any(f in fqn for f in KEEP_BF16)",
        # JSON strings are TOML basic strings: a name with a quote stays one string.
        "# torchtitan (job config, float8 section): filter_fqns = " + json.dumps(list(keep)),
    ])


def survival_changes(before: Sequence[OperandRow], after: Sequence[OperandRow]) -> list[str]:
    """What a filter (or another recipe) changes: per Linear kept in bf16, its values no longer
    flushed; then the values flushed and the FP8 Linears, before against after.

    >>> from types import SimpleNamespace as NS
    >>> s = NS(zeros=3, nonzero=64, zero_share=3 / 64)
    >>> row = NS(module="fc1", operand="input", fmt="e4m3", survival=s)
    >>> print("\\n".join(survival_changes([row], [])))
    fc1 input: 3 of 64 flushed (4.69%) in e4m3 -> bf16 (filtered)
    values flushed to zero in FP8 GEMM operands: 3 -> 0; FP8 Linears 1 -> 0
    """
    kept = {r.module for r in before} - {r.module for r in after}
    lines = [f"{r.module} {r.operand}: {r.survival.zeros} of {r.survival.nonzero} flushed "
             f"({r.survival.zero_share:.2%}) in {r.fmt} -> bf16 (filtered)"
             for r in before if r.module in kept]  # fmt: skip
    total = [sum(r.survival.zeros for r in rows) for rows in (before, after)]
    lines.append(f"values flushed to zero in FP8 GEMM operands: {total[0]} -> {total[1]}; "
                 f"FP8 Linears {len({r.module for r in before})} -> "
                 f"{len({r.module for r in after})}")  # fmt: skip
    return lines


#: ``fp8 --dot``'s fill of each node role (the rest light grey).
FLOW_COLOURS = {"gemm-fp8": "#f4a261", "cast-fp8": "#e9c46a", "scale": "#a8dadc",
                "scaling": "#d8e2dc", "gemm-bf16": "#90be6d", "gemm-mixed": "#e63946",
                "gemm-mx-emulated": "#f4a261", "dequant": "#cdb4db"}  # fmt: skip


def _flow_label(step: FlowStep) -> str:
    return f"{step.op}\\n{step.dtype}" if step.dtype else step.op


def flow_dot(flow: ModuleFlow) -> str:
    """``ampgraph fp8 --dot``: Graphviz source of one module's forward nodes
    (:func:`ampgraph.fp8.graph.module_flow`), coloured by role, the nodes they read from outside
    it as dashed boxes; its line end included.

    >>> from types import SimpleNamespace as NS
    >>> x = NS(name="x", op="x", dtype="bf16", role="", inputs=())
    >>> amax = NS(name="amax", op="amax", dtype="fp32", role="scale", inputs=("x",))
    >>> print(flow_dot(NS(module="fc1", steps=(amax,), sources={"x": x})).splitlines()[2])
      "amax" [label="amax\\nfp32", fillcolor="#a8dadc"];
    """
    # The module's name stays out of the source: add_module accepts any string, quotes too.
    lines = ["digraph fp8 {", "  rankdir=TB; node [shape=box, style=filled, "
             'fontname="Helvetica", fontsize=10, fillcolor="#ffffff"];']
    names = {step.name for step in flow.steps}
    outer: set[str] = set()
    for step in flow.steps:
        fill = FLOW_COLOURS.get(step.role, "#eeeeee")
        lines.append(f'  "{step.name}" [label="{_flow_label(step)}", fillcolor="{fill}"];')
        for a in step.inputs:
            if a not in names and a not in outer:
                outer.add(a)
                lines.append(f'  "{a}" [label="{_flow_label(flow.sources[a])}", style=dashed];')
            lines.append(f'  "{a}" -> "{step.name}";')
    lines.append("}")
    return "\n".join(lines) + "\n"


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


def _operands(g: Gemm) -> str:
    """``e4m3 tensorwise, e4m3 tensorwise`` for a ``_scaled_mm``; ``bf16 from e4m3 mx-1x32``
    for torchao's emulated MX GEMM (dequantized operands); the matrices' dtypes else."""
    if g.scaling:
        sep = " from " if g.dequantized else " "
        return ", ".join(f"{d}{sep}{s}" for d, s in zip(g.operands, g.scaling, strict=False))
    return ", ".join(g.operands)


def gemm_text(g: Gemm) -> str:
    """One GEMM (:class:`ampgraph.fp8.compare.Gemm`) as a line: ``op(operands) -> out``, and a
    mixed pair's fate.

    >>> from types import SimpleNamespace as NS
    >>> gemm_text(NS(op="mm", operands=("bf16", "fp32"), scaling=(), out="fp32", mixed=True))
    'mm(bf16, fp32) -> fp32  <- mixed operand dtypes: the real kernel raises'
    """
    raises = "  <- mixed operand dtypes: the real kernel raises" if g.mixed else ""
    return f"{g.op}({_operands(g)}) -> {g.out}{raises}"


def _walk(graph: Fp8Graph, phases: Sequence[str]) -> list[tuple[str, str | None, Fp8Node]]:
    """Each GEMM of ``phases`` in graph order with its phase and where it is: None for a forward
    GEMM, which its module names; ``GEMM i`` for the backward's, which run outside any module's
    call and are known by position."""
    return [(phase, None if phase == "forward" else f"GEMM {i}", g)
            for phase in phases for i, g in enumerate(graph.gemms(phase))]  # fmt: skip


def gemm_lines(graph: Fp8Graph, phases: Sequence[str] = ("forward", "backward")) -> list[str]:
    """One line per GEMM of ``phases``, in graph order, as forward hooks print a module call.
    The backward's GEMMs run outside any module's call: they are listed by position."""
    from ampgraph.fp8.compare import gemm_of

    return [f"[{g.module if at is None else f'{phase} {at}'}] {phase} {gemm_text(gemm_of(g))}"
            for phase, at, g in _walk(graph, phases)]  # fmt: skip


def table_text(graph: Fp8Graph, *, phases: Sequence[str]) -> str:
    """``table --recipe torchao:...``: the recipe's line, then each GEMM's."""
    return graph_text(graph).splitlines()[0] + "\n" + "\n".join(gemm_lines(graph, tuple(phases)))


def table_markdown(graph: Fp8Graph, *, phases: Sequence[str]) -> str:
    """``table --recipe torchao:... --format markdown``: the GEMMs as a table (module, pass,
    op, operands, output)."""
    from ampgraph.fp8.compare import gemm_of

    rows = ["| module | pass | GEMM | operands | output |", "| --- | --- | --- | --- | --- |"]
    rows += [f"| {code_span(g.module) if at is None else at} | {phase} | `{g.op}` | "
             f"{_operands(gemm_of(g))} | {g.dtype_out} |" for phase, at, g in _walk(graph, phases)]  # fmt: skip
    return "\n".join(rows)


def change_lines(changes: Fp8Changes) -> list[str]:
    """What changes between two recipes' graphs (:func:`ampgraph.fp8.compare.compare`), a line
    each: a Linear that changes side (and why), a module whose forward GEMMs change, a kind of
    backward GEMM whose count changes. Empty: the graphs are the same."""
    side = ("FP8", "bf16")
    lines = [f"{c.fqn}: {side[not c.converted[0]]} -> {side[not c.converted[1]]} ({c.reason})"
             for c in changes.sides]  # fmt: skip
    for module, was, now in changes.forward:
        shown = ["; ".join(gemm_text(g) for g in gemms) or "-" for gemms in (was, now)]
        lines.append(f"[{module}] forward: {shown[0]} => {shown[1]}")
    lines += [f"backward: {n_a} -> {n_b} x {gemm_text(kind)}"
              for kind, n_a, n_b in changes.backward]  # fmt: skip
    return lines


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


#: ``diff --recipe torchao:A --recipe torchao:B``'s survival: each recipe's operand rows.
Tables = tuple["Sequence[OperandRow]", "Sequence[OperandRow]"]


def _recipes_diff(changes: Fp8Changes, a: str, b: str, survival: Tables, bullet: str) -> str:
    lines = [f"A: {a}", f"B: {b}", *(change_lines(changes) or ["the FP8 graphs are the same"]),
             *survival_changes(*survival)]  # fmt: skip
    return "\n".join(bullet + line for line in lines)


def recipes_diff_text(changes: Fp8Changes, *, a: str, b: str, survival: Tables,
                      equal: bool) -> str:  # fmt: skip
    """``diff --recipe torchao:A --recipe torchao:B``: the graphs' changes, then the survival's
    (:func:`survival_changes`, A's operands against B's)."""
    return _recipes_diff(changes, a, b, survival, "")


def recipes_diff_markdown(changes: Fp8Changes, *, a: str, b: str, survival: Tables,
                          equal: bool) -> str:  # fmt: skip
    """The same as a Markdown list."""
    return _recipes_diff(changes, a, b, survival, "- ")


def recipes_diff_json(changes: Fp8Changes, *, a: str, b: str, survival: Tables,
                      equal: bool) -> str:  # fmt: skip
    """``--format json``."""
    return json.dumps({"a": a, "b": b, "equal": equal, "changes": change_lines(changes),
                       "survival": survival_changes(*survival)}, indent=1)  # fmt: skip


__all__ = [
    "change_lines", "filter_code", "findings_json", "findings_markdown", "findings_text",
    "flow_dot", "fp8_json", "fp8_text", "gemm_lines", "gemm_text", "graph_text", "proof_json",
    "proof_text", "recipes_diff_json", "recipes_diff_markdown", "recipes_diff_text", "row_text",
    "survival_changes", "survival_json", "survival_text", "table_json", "table_markdown",
    "table_text",
]  # fmt: skip
