"""The compiled dtype flow as text: a table per node, the eager-vs-compiled diff, audit findings;
and as JSON (``ampgraph compiled --view``: :func:`table_text`, :func:`diff_text`,
:func:`audit_text`, :func:`flow_json`).

>>> from ampgraph.compiled.flow import CompiledFlow, CompiledNode
>>> f = CompiledFlow("m", "amp-fp32", "2.14.1", "cpp", {"emulate_precision_casts": False},
...                  [CompiledNode("gelu", "mlp", "bfloat16", "in-register", "op4")])
>>> print(diff_lines(f)[1])
  gelu  (mlp)  bfloat16: eager rounds to bfloat16, compiled keeps fp32 in kernel op4
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence

from ampgraph.compiled.flow import (
    LOW_PRECISION, CompiledFlow, CompiledNode, Kernel, differing_roundings,
)
from ampgraph.report.escape import code_span

_FATE_WORDS = {
    "stored": "stored in a buffer",
    "extern": "written by an extern kernel",
    "in-register": "inside the kernel, never stored",
    "emulated": "rounded in the kernel (emulate_precision_casts)",
    "removed": "removed by a graph pass",
    "eager": "run eagerly (torch.compiler.disable: a graph break)",
}


def header(flow: CompiledFlow) -> str:
    """What the answer is for: model, setting, torch release, backend and Inductor's options."""
    opts = ", ".join(f"{k}={v}" for k, v in flow.options.items())
    return (f"{flow.model} in {flow.setting} under torch.compile: torch {flow.torch_version}, "
            f"Inductor {flow.backend} backend ({opts})")  # fmt: skip


def table_lines(flow: CompiledFlow) -> list[str]:
    """One line per node: name, module, eager dtype, compiled fate, kernel."""
    width = max([len(n.name) for n in flow.nodes] + [4])
    kw = max([len(n.kernel or "-") for n in flow.nodes] + [6])
    lines = [header(flow), f"{'node':<{width}}  {'dtype':<9} {'kernel':<{kw}} compiled  [module]"]
    for n in flow.nodes:
        mark = "  << fp32 in the kernel: eager's rounding dropped" if n.drops_rounding else ""
        mark = mark or ("  (a view or exact copy: no rounding)" if not n.computes else "")
        lines.append(f"{n.name:<{width}}  {n.dtype:<9} {n.kernel or '-':<{kw}} "
                     f"{_FATE_WORDS[n.fate]}  [{n.module or '(top)'}]{mark}")  # fmt: skip
    lines.append(f"{len(flow.kernels)} kernels: " + ", ".join(
        f"{k.name} {k.kind}" + (f" {k.call}" if k.call else "") for k in flow.kernels))  # fmt: skip
    return lines + unmapped_lines(flow)


def unmapped_lines(flow: CompiledFlow) -> list[str]:
    """A line naming the captured nodes the plan could not place in any kernel (their fate, so
    whether their rounding is dropped, is unknown), or none.

    >>> unmapped_lines(CompiledFlow("m", "amp", "2", "cpp", {}, unmapped=["mul"]))
    ['1 node(s) unmapped (no lowered value found, fate unknown): mul']
    """
    if not flow.unmapped:
        return []
    return [f"{len(flow.unmapped)} node(s) unmapped (no lowered value found, fate unknown): "
            + ", ".join(flow.unmapped)]


def table_markdown(flow: CompiledFlow) -> list[str]:
    """:func:`table_lines` as a Markdown table (a pull request's comment).

    >>> from ampgraph.compiled.flow import CompiledNode
    >>> f = CompiledFlow("m", "amp-fp32", "2.14.1", "cpp", {},
    ...                  [CompiledNode("gelu", "mlp", "bfloat16", "in-register", "op4")])
    >>> table_markdown(f)[-1]
    "| `gelu` | `mlp` | bfloat16 | op4 | inside the kernel, never stored **(eager's rounding dropped)** |"
    >>> odd = CompiledFlow("m", "amp-fp32", "2.14.1", "cpp", {},  # a module's name in its cell
    ...                    [CompiledNode("gelu", "a|b`c", "bfloat16", "stored", "op4")])
    >>> table_markdown(odd)[-1].split(" | ")[1]
    '``a\\\\|b`c``'
    """
    lines = [f"**{header(flow)}**", "", "| node | module | dtype | kernel | compiled |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for n in flow.nodes:
        fate = _FATE_WORDS[n.fate] + (" **(eager's rounding dropped)**" if n.drops_rounding else "")
        lines.append(f"| {code_span(n.name)} | {code_span(n.module or '(top)')} | {n.dtype} | "
                     f"{n.kernel or '-'} | {fate} |")  # fmt: skip
    return lines


def diff_lines(flow: CompiledFlow) -> list[str]:
    """The rounding points where the compiled program differs from eager, by node and module."""
    dropped = flow.dropped()
    lines = [f"{len(dropped)} eager rounding point(s) the compiled program drops"]
    if flow.eager_regions:
        lines.append(f"{flow.graphs} compiled graph(s), broken by {len(flow.eager_regions)} "
                     "torch.compiler.disable region(s) run eagerly, rounding as eager: "
                     + "; ".join(flow.eager_regions))  # fmt: skip
    for n in dropped:
        lines.append(f"  {n.name}  ({n.module or 'top'})  {n.dtype}: eager rounds to {n.dtype}, "
                     f"compiled keeps fp32 in kernel {n.kernel}")  # fmt: skip
    removed = [c for c in flow.casts if c.fate in ("in-register", "removed")
               and c.target in LOW_PRECISION]  # fmt: skip
    if removed:
        lines.append(f"{len(removed)} cast(s) to 16 bits that fusion leaves unperformed: "
                     + ", ".join(f"{c.node} of {c.owner}" for c in removed))  # fmt: skip
    return lines + unmapped_lines(flow)


#: Bytes of one element of a 16-bit dtype.
_BYTES16 = 2


def _region_bytes(nodes: list[CompiledNode], shapes: Mapping[str, Sequence[int]]) -> int | None:
    """Bytes the dropped values of one kernel take as stored 16-bit buffers (None: a shape is
    not known)."""
    total = 0
    for n in nodes:
        shape = shapes.get(n.name)
        if shape is None:
            return None
        total += _BYTES16 * math.prod(shape)
    return total


def _emulation_cost(flow: CompiledFlow, emulated: CompiledFlow | None, k: Kernel) -> str:
    """What emulate_precision_casts costs, read off the plan made with it (or stated)."""
    if emulated is None:
        return "extra casts in registers, no extra memory traffic"
    stores = sum(len(x.stores) for x in flow.kernels)
    e_stores = sum(len(x.stores) for x in emulated.kernels)
    rounded = [n.name for n in emulated.nodes if n.kernel == k.name and n.fate == "emulated"]
    return (f"{len(rounded)} rounding(s) in registers in this kernel; the whole graph plans "
            f"{len(flow.kernels)} -> {len(emulated.kernels)} kernels and {stores} -> {e_stores} "
            "stored buffers with it")  # fmt: skip


def audit_lines(
    flow: CompiledFlow, emulated: CompiledFlow | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> list[str]:  # fmt: skip
    """A finding per kernel whose compiled numerics differ from eager, with the ways to get
    eager's numbers and their cost: ``emulated`` is the plan made with ``emulate_precision_casts``
    (its kernels and stores), ``shapes`` each node's output shape (the bytes a barrier stores).
    A rounding a pattern replacement folded away is not offered emulation, which cannot restore it.

    >>> from ampgraph.compiled.flow import CompiledNode
    >>> f = CompiledFlow("m", "amp-fp32", "2.14.1", "cpp", {},
    ...                  [CompiledNode("mul", "", "bfloat16", "in-register", "op2", folded=True)],
    ...                  kernels=[Kernel("op2", "reduction", ("softmax",), ())])
    >>> "emulate_precision_casts cannot restore mul (top)" in audit_lines(f)[0]
    True
    """
    lines = []
    for k in flow.kernels:
        nodes = [n for n in flow.nodes if n.kernel == k.name and n.drops_rounding]
        if not nodes:
            continue
        names = ", ".join(f"{n.name} ({n.module or 'top'})" for n in nodes)
        size = _region_bytes(nodes, shapes or {})
        stored = (f"{size} bytes written and read back" if size is not None
                  else "the values written and read back")  # fmt: skip
        barrier = (
            "an autocast barrier: end the fused region after each value (torch.compiler.disable "
            "on the op, or torch._dynamo.graph_break(); torch 2.14's Inductor has no barrier op "
            f"of its own), cost: {len(nodes)} more stored 16-bit buffer(s) ({stored}), up to "
            f"{len(nodes)} more kernel(s), and a graph break's return to Python each"
        )  # fmt: skip
        lines.append(
            f"warning: kernel {k.name} ({k.kind}) keeps {len(nodes)} {nodes[0].dtype} value(s) in "
            f"fp32 that eager rounds: {names}. Compiled output differs from eager by 16-bit "
            f"roundings. For eager's numbers: {_remedies(flow, emulated, k, nodes, barrier)}"
        )
    return lines or [f"no kernel drops an eager rounding ({header(flow)})"]


def _remedies(
    flow: CompiledFlow, emulated: CompiledFlow | None, k: Kernel, nodes: list[CompiledNode],
    barrier: str,
) -> str:  # fmt: skip
    """The remedies of one finding: emulation only for the roundings it restores, since a value a
    pattern replacement folded into the kernel's math is no node it could round."""
    folded = [f"{n.name} ({n.module or 'top'})" for n in nodes if n.folded]
    if not folded:
        return ("(1) torch._inductor.config.emulate_precision_casts = True, cost: "
                f"{_emulation_cost(flow, emulated, k)}; (2) {barrier}")  # fmt: skip
    why = (f"torch._inductor.config.emulate_precision_casts cannot restore {', '.join(folded)}: "
           "an Inductor pattern replacement folded it into the kernel's math, and the value "
           "eager rounds is no node of the rewritten graph, so there is nothing to round")  # fmt: skip
    rest = [f"{n.name} ({n.module or 'top'})" for n in nodes if not n.folded]
    if not rest:
        return f"{barrier} ({why})"
    return (f"(1) torch._inductor.config.emulate_precision_casts = True for {', '.join(rest)} "
            f"only ({why}), cost: {_emulation_cost(flow, emulated, k)}; (2) {barrier}")  # fmt: skip


def sides_diff_lines(labels: Sequence[str], flows: Sequence[CompiledFlow | None]) -> list[str]:
    """The rounding points where two sides differ (a side None: eager, which drops none), by
    node and module name: what ``ampgraph diff --compile eager --compile inductor`` prints.

    >>> from ampgraph.compiled.flow import CompiledNode
    >>> f = CompiledFlow("m", "amp-fp32", "2.14.1", "cpp", {},
    ...                  [CompiledNode("gelu", "mlp", "bfloat16", "in-register", "op4")])
    >>> sides_diff_lines(["A eager", "B inductor"], [None, f])[1]
    '  gelu  (mlp)  bfloat16: A eager rounds it, B inductor keeps fp32 in kernel op4'
    """
    differ = differing_roundings(flows[0], flows[1])
    lines = [f"{len(differ)} rounding point(s) differ between {labels[0]} and {labels[1]}"]
    for side, n in differ:
        lines.append(f"  {n.name}  ({n.module or 'top'})  {n.dtype}: {labels[1 - side]} rounds "
                     f"it, {labels[side]} keeps fp32 in kernel {n.kernel}")  # fmt: skip
    return lines


def check_lines(flow: CompiledFlow, disagreements: Sequence[str]) -> list[str]:
    """``check --compile inductor``: a summary line, then a line per disagreement between the
    plan and the C++ code Inductor really generated, with the kernel and nodes of its buffer.

    >>> from ampgraph.compiled.flow import CompiledNode
    >>> f = CompiledFlow("m", "amp-fp32", "2.14.1", "cpp", {},
    ...                  [CompiledNode("linear", "f", "bfloat16", "extern", "op3", "buf3")],
    ...                  kernels=[Kernel("op3", "extern", ("linear",), (("buf3", "bfloat16"),))])
    >>> check_lines(f, ["16-bit buffer buf3 only in the plan"])[1]
    '  16-bit buffer buf3 only in the plan: kernel op3, linear (f)'
    """
    typed = sum(len(k.stores) for k in flow.kernels)
    verdict = "agrees with" if not disagreements else f"{len(disagreements)} disagreement(s) with"
    modules = {n.name: n.module or "top" for n in flow.nodes}
    writer = {b: k for k in flow.kernels for b, _ in k.stores}
    lines = [f"{flow.model} {flow.setting}: Inductor's plan ({len(flow.kernels)} kernels, {typed} "
             f"stored buffers, {len(flow.dropped())} dropped rounding(s)) {verdict} the C++ code "
             f"Inductor generated (torch {flow.torch_version})"]  # fmt: skip
    for d in disagreements:
        buffer = re.search(r"\bbuf\d+\b", d)
        kernel = writer.get(buffer.group(0)) if buffer else None
        names = ", ".join(f"{n} ({modules.get(n, '?')})" for n in kernel.nodes) if kernel else ""
        lines.append(f"  {d}" + (f": kernel {kernel.name}, {names}" if names else ""))
    return lines
def table_text(flow: CompiledFlow) -> str:
    """``--view table``: :func:`table_lines` as text."""
    return "\n".join(table_lines(flow))


def diff_text(flow: CompiledFlow) -> str:
    """``--view diff``: :func:`diff_lines` as text."""
    return "\n".join(diff_lines(flow))


def audit_text(flow: CompiledFlow) -> str:
    """``--view audit``: :func:`audit_lines` as text."""
    return "\n".join(audit_lines(flow))


def flow_json(flow: CompiledFlow) -> str:
    """``--view json``: the flow's record."""
    return json.dumps(flow.to_dict(), indent=1)


# -- the compile axis of the setting commands: each command's output, per format -----------------


def flows_table_text(flows: Sequence[CompiledFlow]) -> str:
    """``table --compile inductor``: each setting's nodes, their fate and kernel."""
    return "\n\n".join("\n".join(table_lines(f)) for f in flows)


def flows_table_markdown(flows: Sequence[CompiledFlow]) -> str:
    """``table --compile inductor --format markdown``."""
    return "\n\n".join("\n".join(table_markdown(f)) for f in flows)


def flows_table_json(flows: Sequence[CompiledFlow]) -> str:
    """``table --compile inductor --format json``: one record, or a list of them."""
    payload = [f.to_dict() for f in flows]
    return json.dumps(payload[0] if len(payload) == 1 else payload, indent=1)


def findings_text(found: Sequence[tuple[CompiledFlow, Sequence[str]]]) -> str:
    """``audit --compile inductor``: each setting's header, then its lines."""
    return "\n\n".join("\n".join([header(f), *lines]) for f, lines in found)


def findings_json(found: Sequence[tuple[CompiledFlow, Sequence[str]]]) -> str:
    """``audit --compile inductor --format json``: each setting's findings."""
    return json.dumps([{"model": f.model, "setting": f.setting, "header": header(f),
                        "findings": [ln for ln in lines if ln.startswith("warning:")]}
                       for f, lines in found], indent=1)  # fmt: skip


def check_text(results: Sequence[tuple[CompiledFlow, Sequence[str]]]) -> str:
    """``check --compile inductor``: :func:`check_lines` of each setting."""
    return "\n".join("\n".join(check_lines(flow, found)) for flow, found in results)


def check_json(results: Sequence[tuple[CompiledFlow, Sequence[str]]]) -> str:
    """``check --compile inductor --format json``."""
    return json.dumps([{"model": f.model, "setting": f.setting, "header": header(f),
                        "disagreements": list(found)} for f, found in results], indent=1)  # fmt: skip


def sides_text(flows: Sequence[CompiledFlow | None], *, labels: Sequence[str]) -> str:
    """``diff --compile A --compile B``: :func:`sides_diff_lines`."""
    return "\n".join(sides_diff_lines(labels, flows))


def sides_json(flows: Sequence[CompiledFlow | None], *, labels: Sequence[str]) -> str:
    """``diff --compile A --compile B --format json``."""
    lines = sides_diff_lines(labels, flows)
    return json.dumps({"a": labels[0], "b": labels[1],
                       "equal": not differing_roundings(flows[0], flows[1]),
                       "differ": lines[1:]}, indent=1)  # fmt: skip
